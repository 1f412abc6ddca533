//! Python's `repr` of a float, so that error texts read exactly as PyTorch's
//! (`Invalid epsilon value: -1e-08`, `Invalid beta parameter at index 0: 1.0`).

/// `repr(x)` for a Python float.
///
/// ```
/// use distopt::pyfmt::float_repr;
/// assert_eq!(float_repr(-1e-8), "-1e-08");
/// assert_eq!(float_repr(1.0), "1.0");
/// assert_eq!(float_repr(-0.1), "-0.1");
/// assert_eq!(float_repr(1e16), "1e+16");
/// assert_eq!(float_repr(f64::INFINITY), "inf");
/// ```
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Shortest round-trip digits, then Python's choice of notation.
    let sci = format!("{x:e}");
    let (mantissa, exponent) = sci.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("integer exponent");
    if !(-4..16).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exponent.abs());
    }
    let plain = format!("{x}");
    if plain.contains('.') {
        plain
    } else {
        format!("{plain}.0")
    }
}
