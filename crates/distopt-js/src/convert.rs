//! Values across the JS boundary: tensors as `{dtype, shape, data}` (typed arrays, or number
//! lists and nested lists as the golden JSON writes them), JSON-like values (options, state
//! dicts), numbers and indices, all checked with the library's error kinds and texts.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use half::{bf16, f16};
use js_sys::{Array, Float32Array, Float64Array, Object, Reflect, Uint16Array};
use serde_json::{Map, Value};
use wasm_bindgen::{JsCast, JsValue};

use super::budget;
use distopt::dtype::DType;
use distopt::error::{Error, ErrorKind, Result};
use distopt::json::{number_from_json, number_to_json, tensor_from_json};
use distopt::step::errors;
use distopt::step::{StepRequest, StepSource, read_replicas};
use distopt::tensor::{HostData, Tensor, format_shape, numel_of};

/// Nesting deeper than this in an options object or state dict is an error, not a stack
/// overflow (a cyclic object would otherwise recurse forever).
const MAX_DEPTH: usize = 64;

/// Runs a future that completes without waiting (host-only work behind an `async` signature).
pub(crate) fn now<F: Future>(future: F) -> Result<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(value) => Ok(value),
        Poll::Pending => Err(Error::runtime(
            "internal: an operation expected to finish at once is still pending",
        )),
    }
}

/// `obj[key]`, `undefined` when `obj` is not an object.
pub(crate) fn get(obj: &JsValue, key: &str) -> JsValue {
    if obj.is_object() {
        Reflect::get(obj, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
    } else {
        JsValue::UNDEFINED
    }
}

/// An optional argument as the readers take it: `undefined` when it was left out.
pub(crate) fn or_undefined(value: Option<impl Into<JsValue>>) -> JsValue {
    value.map_or(JsValue::UNDEFINED, Into::into)
}

/// Sets `obj[key] = value` on a fresh plain object (cannot fail there).
pub(crate) fn set(obj: &Object, key: &str, value: impl Into<JsValue>) {
    let _ = Reflect::set(obj, &JsValue::from_str(key), &value.into());
}

/// Longest text of a caller's string echoed in a message; longer ones are cut with "…".
const ECHO_CHARS: usize = 64;

/// `s` cut to [`ECHO_CHARS`] characters (with "…" and its full length when cut), so that a
/// huge string is never echoed back whole.
pub(crate) fn truncated(s: &str) -> String {
    match s.char_indices().nth(ECHO_CHARS) {
        None => s.to_string(),
        Some((end, _)) => format!("{}… ({} characters)", &s[..end], s.chars().count()),
    }
}

/// A JS number as JS writes it (`NaN`, `Infinity`, `-Infinity`, `2.5`).
pub(crate) fn js_number(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        }
    } else {
        format!("{x}")
    }
}

/// How a JS value is named in messages.
pub(crate) fn describe(value: &JsValue) -> String {
    if value.is_undefined() {
        "undefined".into()
    } else if value.is_null() {
        "null".into()
    } else if let Some(b) = value.as_bool() {
        format!("a boolean ({b})")
    } else if let Some(x) = value.as_f64() {
        format!("a number ({})", js_number(x))
    } else if let Some(s) = value.as_string() {
        format!("a string ({:?})", truncated(&s))
    } else if Array::is_array(value) {
        "an array".into()
    } else if value.is_function() {
        "a function".into()
    } else if value.is_bigint() {
        "a bigint".into()
    } else if value.is_symbol() {
        "a symbol".into()
    } else {
        "an object".into()
    }
}

fn type_error(message: String) -> Error {
    Error::type_error(message)
}

/// A number argument: a JS number, or the strings `"nan"`, `"inf"`, `"-inf"`.
pub(crate) fn number(value: &JsValue, what: &str) -> Result<f64> {
    if let Some(x) = value.as_f64() {
        return Ok(x);
    }
    if let Some(s) = value.as_string() {
        return number_from_json(&Value::String(s), &|| what.to_string());
    }
    Err(type_error(format!(
        "{what} must be a number, got {}",
        describe(value)
    )))
}

/// A string argument, or `None` for `undefined`/`null`. (wasm-bindgen's own `String`
/// parameters trust JS to pass a string; this checks.)
pub(crate) fn optional_string(value: &JsValue, what: &str) -> Result<Option<String>> {
    if value.is_undefined() || value.is_null() {
        return Ok(None);
    }
    value
        .as_string()
        .map(Some)
        .ok_or_else(|| type_error(format!("{what} must be a string, got {}", describe(value))))
}

/// A boolean argument: `true` or `false` only (JS's truthiness would read `'no'` as true).
pub(crate) fn bool_arg(value: &JsValue, what: &str) -> Result<bool> {
    value
        .as_bool()
        .ok_or_else(|| type_error(format!("{what} must be a boolean, got {}", describe(value))))
}

/// An optional boolean argument: `undefined` and `null` are `None`.
pub(crate) fn optional_bool_arg(value: &JsValue, what: &str) -> Result<Option<bool>> {
    if value.is_undefined() || value.is_null() {
        return Ok(None);
    }
    bool_arg(value, what).map(Some)
}

/// An integer argument (any sign), as Python's `int`.
pub(crate) fn integer(value: f64, what: &str) -> Result<i64> {
    if !value.is_finite() || value.fract() != 0.0 || value.abs() > 9_007_199_254_740_991.0 {
        return Err(type_error(format!(
            "{what} must be an integer, got {}",
            js_number(value)
        )));
    }
    Ok(value as i64)
}

/// A JS number, without JS's coercion (which turns `null`, `[]` and `[[]]` into 0 and throws
/// its own `TypeError` for a Symbol or a BigInt): anything else is a `TypeError` naming
/// `what` and what it got.
fn number_arg(value: &JsValue, what: &str) -> Result<f64> {
    value.as_f64().ok_or_else(|| {
        type_error(format!(
            "{what} must be an integer, got {}",
            describe(value)
        ))
    })
}

/// An integer argument given as a JS value (any sign), as Python's `int`.
pub(crate) fn integer_arg(value: &JsValue, what: &str) -> Result<i64> {
    integer(number_arg(value, what)?, what)
}

/// An optional integer argument: `undefined` and `null` are `None`.
pub(crate) fn optional_integer_arg(value: &JsValue, what: &str) -> Result<Option<i64>> {
    if value.is_undefined() || value.is_null() {
        return Ok(None);
    }
    integer_arg(value, what).map(Some)
}

/// A non-negative integer argument given as a JS value (a count, a rank, an index).
pub(crate) fn count_arg(value: &JsValue, what: &str) -> Result<usize> {
    count(number_arg(value, what)?, what)
}

/// A rank argument given as a JS value, checked against the number of ranks.
pub(crate) fn rank_arg(value: &JsValue, ranks: usize) -> Result<usize> {
    rank_index(number_arg(value, "rank")?, ranks)
}

/// A parameter index given as a JS value, checked against the number of parameters.
pub(crate) fn param_arg(value: &JsValue, params: usize) -> Result<usize> {
    param_index(number_arg(value, "parameter index")?, params)
}

/// A non-negative integer argument (a count, a rank, an index).
pub(crate) fn count(value: f64, what: &str) -> Result<usize> {
    let n = integer(value, what)?;
    usize::try_from(n)
        .map_err(|_| Error::value(format!("{what} must be a non-negative integer, got {n}")))
}

/// A rank argument, checked against the number of ranks (an `IndexError` when out of range).
pub(crate) fn rank_index(value: f64, ranks: usize) -> Result<usize> {
    index_below(value, "rank", ranks, "ranks")
}

/// A parameter index, checked against the number of parameters.
pub(crate) fn param_index(value: f64, params: usize) -> Result<usize> {
    index_below(value, "parameter index", params, "parameters")
}

/// An index `what` below `len` (`IndexError` "rank 4 out of range for 4 ranks" otherwise).
fn index_below(value: f64, what: &str, len: usize, plural: &str) -> Result<usize> {
    let i = count(value, what)?;
    if i >= len {
        let noun = what.trim_end_matches(" index");
        return Err(Error::new(
            ErrorKind::IndexError,
            format!("{noun} {i} out of range for {len} {plural}"),
        ));
    }
    Ok(i)
}

/// A JS array, or a `TypeError` naming `what`.
pub(crate) fn array(value: &JsValue, what: &str) -> Result<Array> {
    if Array::is_array(value) {
        Ok(value.clone().unchecked_into())
    } else {
        Err(type_error(format!(
            "{what} must be an array, got {}",
            describe(value)
        )))
    }
}

/// A list of non-negative integers (parameter indices, a shape).
pub(crate) fn index_list(value: &JsValue, what: &str) -> Result<Vec<usize>> {
    let items = array(value, what)?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item.as_f64() {
            Some(x) => count(x, &format!("{what}[{i}]")),
            None => Err(type_error(format!(
                "{what}[{i}] must be an integer, got {}",
                describe(&item)
            ))),
        })
        .collect()
}

/// One element of a plain data list: a number (NaN and ±Infinity included) or `"nan"`,
/// `"inf"`, `"-inf"`.
fn element(value: &JsValue, what: &dyn Fn() -> String) -> Result<f64> {
    if let Some(x) = value.as_f64() {
        return Ok(x);
    }
    if let Some(s) = value.as_string() {
        return number_from_json(&Value::String(s), what);
    }
    Err(Error::value(format!(
        "{}: expected a number, got {}",
        what(),
        describe(value)
    )))
}

/// Flattens a nested list of numbers, checking that it is rectangular (the messages of
/// `json::tensor_from_json`).
fn flatten_nested(
    value: &JsValue,
    shape: &mut Vec<usize>,
    depth: usize,
    out: &mut Vec<f64>,
    what: &str,
) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::value(format!("{what}: nested too deeply")));
    }
    if Array::is_array(value) {
        let items: &Array = value.unchecked_ref();
        let len = items.length() as usize;
        // By its length, before any element is read: a huge (sparse) list is refused at once.
        budget::check_elements(&format!("{what} (a list of {len} numbers)"), len, 8)?;
        if depth == shape.len() {
            if depth > 0 && !out.is_empty() {
                return Err(Error::value(format!(
                    "{what}: ragged nested list (a list where a number was expected at depth {depth})"
                )));
            }
            shape.push(len);
        } else if shape[depth] != len {
            return Err(Error::value(format!(
                "{what}: ragged nested list: a list of {len} elements at depth {depth} where {} were expected",
                shape[depth]
            )));
        }
        for item in items.iter() {
            flatten_nested(&item, shape, depth + 1, out, what)?;
        }
        return Ok(());
    }
    if depth != shape.len() {
        return Err(Error::value(format!(
            "{what}: ragged nested list (a number where a list was expected at depth {depth})"
        )));
    }
    out.push(element(value, &|| what.to_string())?);
    Ok(())
}

/// The dtype named by a tensor object's `dtype` (inferred from a Float32Array or
/// Float64Array `data` when absent). `Err(name)` for a name that is no float dtype.
fn tensor_dtype(
    obj: &JsValue,
    data: &JsValue,
    what: &str,
) -> Result<std::result::Result<DType, String>> {
    let dtype = get(obj, "dtype");
    if dtype.is_undefined() || dtype.is_null() {
        return if data.is_instance_of::<Float64Array>() {
            Ok(Ok(DType::Float64))
        } else if data.is_instance_of::<Uint16Array>() {
            Err(type_error(format!(
                "{what}: Uint16Array data holds float16 or bfloat16 bit patterns: say which with \"dtype\""
            )))
        } else {
            Ok(Ok(DType::Float32))
        };
    }
    let name = dtype.as_string().ok_or_else(|| {
        type_error(format!(
            "{what}: \"dtype\" must be a string, got {}",
            describe(&dtype)
        ))
    })?;
    Ok(DType::parse(&name).map_err(|_| name))
}

/// The values of a tensor object's `data` in `dtype`, for a tensor of `numel` elements.
fn tensor_data(data: &JsValue, dtype: DType, shape: &[usize], what: &str) -> Result<HostData> {
    let numel = numel_of(shape)?;
    // Every copy below is checked first: its length against the shape, then its bytes against
    // the module's budget (`bytes_per_value`: the input's and, when it is converted, the stored
    // form's in `dtype`).
    let stored = dtype.size_bytes() as u64;
    let admit = |len: usize, values: &str, bytes_per_value: u64| {
        if len != numel {
            return Err(Error::value(format!(
                "{what}: data has {len} values but shape {} needs {numel}",
                format_shape(shape)
            )));
        }
        budget::check(
            &format!("{what} ({len} {values})"),
            (len as u64).saturating_mul(bytes_per_value),
        )
    };
    if let Some(a) = data.dyn_ref::<Float32Array>() {
        let len = a.length() as usize;
        admit(len, "float32 values", 4 + stored)?;
        let mut values = budget::zeroed::<f32>(what, len)?;
        a.copy_to(&mut values);
        return Ok(match dtype {
            DType::Float32 => HostData::Float32(values),
            other => HostData::from_f64(
                other,
                &values.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(),
            ),
        });
    }
    if let Some(a) = data.dyn_ref::<Float64Array>() {
        let len = a.length() as usize;
        admit(len, "float64 values", 8 + stored)?;
        let mut values = budget::zeroed::<f64>(what, len)?;
        a.copy_to(&mut values);
        return Ok(HostData::from_f64(dtype, &values));
    }
    if let Some(a) = data.dyn_ref::<Uint16Array>() {
        let len = a.length() as usize;
        admit(len, "16-bit values", 2)?;
        let mut bits = budget::zeroed::<u16>(what, len)?;
        a.copy_to(&mut bits);
        return match dtype {
            DType::Float16 => Ok(HostData::Float16(
                bits.into_iter().map(f16::from_bits).collect(),
            )),
            DType::BFloat16 => Ok(HostData::BFloat16(
                bits.into_iter().map(bf16::from_bits).collect(),
            )),
            other => Err(type_error(format!(
                "{what}: Uint16Array data holds float16 or bfloat16 bit patterns, not {other} values: use a Float32Array, a Float64Array or a number array"
            ))),
        };
    }
    if js_sys::ArrayBuffer::is_view(data) && !data.is_instance_of::<js_sys::DataView>() {
        if data.is_instance_of::<js_sys::BigInt64Array>()
            || data.is_instance_of::<js_sys::BigUint64Array>()
        {
            return Err(type_error(format!(
                "{what}: BigInt typed arrays are not float data"
            )));
        }
        let len = get(data, "length").as_f64().unwrap_or(0.0) as usize;
        admit(len, "values", 8 + stored)?;
        // Any other typed array: its values, converted by JS.
        let values = Float64Array::new(data);
        let mut out = budget::zeroed::<f64>(what, values.length() as usize)?;
        values.copy_to(&mut out);
        return Ok(HostData::from_f64(dtype, &out));
    }
    if Array::is_array(data) {
        let items: &Array = data.unchecked_ref();
        let len = items.length() as usize;
        admit(len, "values", 8 + stored)?;
        let values = items
            .iter()
            .enumerate()
            .map(|(i, v)| element(&v, &|| format!("{what}, element {i}")))
            .collect::<Result<Vec<f64>>>()?;
        return Ok(HostData::from_f64(dtype, &values));
    }
    Err(Error::value(format!(
        "{what}: a tensor object needs a \"data\" typed array or list, got {}",
        describe(data)
    )))
}

/// A tensor whose dtype may be no float dtype: `Err(name)` carries the rejected name, so that
/// the step can report it in its own words and order.
fn tensor_or_dtype(value: &JsValue, what: &str) -> Result<std::result::Result<Tensor, String>> {
    if Array::is_array(value) || value.as_f64().is_some() {
        let mut shape = Vec::new();
        let mut values = Vec::new();
        flatten_nested(value, &mut shape, 0, &mut values, what)?;
        return Tensor::new(&shape, HostData::from_f64(DType::Float32, &values)).map(Ok);
    }
    if value.is_instance_of::<Float32Array>() || value.is_instance_of::<Float64Array>() {
        let dtype = if value.is_instance_of::<Float32Array>() {
            DType::Float32
        } else {
            DType::Float64
        };
        let len = Reflect::get(value, &"length".into())
            .ok()
            .and_then(|l| l.as_f64())
            .unwrap_or(0.0) as usize;
        let data = tensor_data(value, dtype, &[len], what)?;
        return Tensor::new(&[len], data).map(Ok);
    }
    if !value.is_object() || value.is_function() {
        return Err(Error::value(format!(
            "{what}: expected a tensor (a {{dtype, shape, data}} object, a typed array or a nested list), got {}",
            describe(value)
        )));
    }
    let data = get(value, "data");
    let dtype = match tensor_dtype(value, &data, what)? {
        Ok(dtype) => dtype,
        Err(name) => return Ok(Err(name)),
    };
    let shape_value = get(value, "shape");
    let shape = if shape_value.is_undefined() || shape_value.is_null() {
        let len = get(&data, "length").as_f64().unwrap_or(0.0) as usize;
        vec![len]
    } else {
        if !Array::is_array(&shape_value) {
            return Err(Error::value(format!(
                "{what}: a tensor object needs a \"shape\" list"
            )));
        }
        let dims: &Array = shape_value.unchecked_ref();
        dims.iter()
            .map(|d| {
                d.as_f64()
                    .filter(|x| {
                        x.is_finite() && x.fract() == 0.0 && *x >= 0.0 && *x <= 4_294_967_295.0
                    })
                    .map(|x| x as usize)
                    .ok_or_else(|| {
                        Error::value(format!(
                            "{what}: shape entries must be non-negative integers, got {}",
                            describe(&d)
                        ))
                    })
            })
            .collect::<Result<Vec<usize>>>()?
    };
    let host = tensor_data(&data, dtype, &shape, what)?;
    Tensor::new(&shape, host).map(Ok)
}

/// A tensor from JS: `{dtype, shape, data}` (data a Float32Array, Float64Array, Uint16Array of
/// float16/bfloat16 bits, another typed array, or a list of numbers and `"nan"`/`"inf"`
/// strings), a Float32Array or Float64Array (1-D), or a nested number list (float32).
pub(crate) fn tensor_from_js(value: &JsValue, what: &str) -> Result<Tensor> {
    tensor_or_dtype(value, what)?
        .map_err(|name| Error::value(format!("{what}: unsupported dtype {name}")))
}

/// A tensor, or `None` for `null`/`undefined` (a missing gradient).
pub(crate) fn optional_tensor_from_js(value: &JsValue, what: &str) -> Result<Option<Tensor>> {
    if value.is_null() || value.is_undefined() {
        Ok(None)
    } else {
        tensor_from_js(value, what).map(Some)
    }
}

/// A list of tensors.
pub(crate) fn tensors_from_js(value: &JsValue, what: &str) -> Result<Vec<Tensor>> {
    array(value, what)?
        .iter()
        .enumerate()
        .map(|(j, v)| tensor_from_js(&v, &format!("{what}[{j}]")))
        .collect()
}

/// A list of tensors where `null` means missing.
pub(crate) fn optional_tensors_from_js(value: &JsValue, what: &str) -> Result<Vec<Option<Tensor>>> {
    array(value, what)?
        .iter()
        .enumerate()
        .map(|(j, v)| optional_tensor_from_js(&v, &format!("{what}[{j}]")))
        .collect()
}

/// `[rank][param]` tensors.
pub(crate) fn per_rank_tensors_from_js(value: &JsValue, what: &str) -> Result<Vec<Vec<Tensor>>> {
    array(value, what)?
        .iter()
        .enumerate()
        .map(|(r, v)| tensors_from_js(&v, &format!("{what}[{r}]")))
        .collect()
}

/// A host tensor as `{dtype, shape, data}`: a Float32Array (float32), a Float64Array
/// (float64), or a Uint16Array of bit patterns (float16, bfloat16).
pub(crate) fn tensor_to_js(tensor: &Tensor) -> Result<JsValue> {
    let data = tensor
        .host_data()
        .ok_or_else(|| Error::runtime("internal: a device tensor reached the JS boundary"))?;
    let array: JsValue = match data {
        HostData::Float32(v) => Float32Array::from(v.as_slice()).into(),
        HostData::Float64(v) => Float64Array::from(v.as_slice()).into(),
        HostData::Float16(v) => {
            Uint16Array::from(bytemuck::cast_slice::<f16, u16>(v.as_slice())).into()
        }
        HostData::BFloat16(v) => {
            Uint16Array::from(bytemuck::cast_slice::<bf16, u16>(v.as_slice())).into()
        }
    };
    let shape: Array = tensor
        .shape()
        .iter()
        .map(|&d| JsValue::from_f64(d as f64))
        .collect();
    let obj = Object::new();
    set(&obj, "dtype", tensor.dtype().name());
    set(&obj, "shape", shape);
    set(&obj, "data", array);
    Ok(obj.into())
}

/// Reads a (possibly device-resident) tensor back and converts it.
pub(crate) async fn tensor_to_js_async(tensor: &Tensor) -> Result<JsValue> {
    tensor_to_js(&tensor.to_host().await?)
}

/// A list of tensors as a JS array.
pub(crate) fn tensors_to_js<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Result<Array> {
    tensors.into_iter().map(tensor_to_js).collect()
}

/// A list of optional tensors (`null` where missing).
pub(crate) fn optional_tensors_to_js(tensors: &[Option<Tensor>]) -> Result<Array> {
    tensors
        .iter()
        .map(|t| match t {
            Some(t) => tensor_to_js(t),
            None => Ok(JsValue::NULL),
        })
        .collect()
}

/// A host tensor in the golden JSON form (values as numbers, `"nan"`, `"inf"`, `"-inf"`).
fn tensor_to_json(tensor: &Tensor) -> Result<Value> {
    let data = tensor
        .host_data()
        .ok_or_else(|| Error::runtime("internal: a device tensor reached the JS boundary"))?;
    let values: Vec<Value> = (0..data.len())
        .map(|i| number_to_json(data.get_f64(i)))
        .collect();
    let mut map = Map::new();
    map.insert("dtype".into(), Value::from(tensor.dtype().name()));
    map.insert("shape".into(), Value::from(tensor.shape().to_vec()));
    map.insert("data".into(), Value::Array(values));
    Ok(Value::Object(map))
}

/// Whether a JS object reads as a tensor (`dtype` and `data` present).
fn looks_like_tensor(value: &JsValue) -> bool {
    !Array::is_array(value)
        && !get(value, "dtype").is_undefined()
        && !get(value, "data").is_undefined()
}

/// A JSON value from JS (options, state dicts): tensors become golden-format tensor objects;
/// integral numbers become JSON integers; non-finite numbers `"nan"`/`"inf"`/`"-inf"`.
pub(crate) fn json_from_js(value: &JsValue, what: &str) -> Result<Value> {
    json_from_js_at(value, what, 0)
}

fn json_from_js_at(value: &JsValue, what: &str, depth: usize) -> Result<Value> {
    if depth > MAX_DEPTH {
        return Err(Error::value(format!(
            "{what}: nested too deeply (or cyclic)"
        )));
    }
    if value.is_null() || value.is_undefined() {
        return Ok(Value::Null);
    }
    if let Some(b) = value.as_bool() {
        return Ok(Value::Bool(b));
    }
    if let Some(x) = value.as_f64() {
        if x.is_finite()
            && x.fract() == 0.0
            && x.abs() <= 9_007_199_254_740_991.0
            && !(x == 0.0 && x.is_sign_negative())
        {
            return Ok(Value::from(x as i64));
        }
        return Ok(number_to_json(x));
    }
    if let Some(s) = value.as_string() {
        return Ok(Value::String(s));
    }
    if value.is_function() || value.is_symbol() || value.is_bigint() {
        return Err(type_error(format!(
            "{what}: {} cannot be converted",
            describe(value)
        )));
    }
    if Array::is_array(value) {
        let items: &Array = value.unchecked_ref();
        // By its length, before any element is read (as `flatten_nested`).
        budget::check_elements(
            &format!("{what} (a list of {} values)", items.length()),
            items.length() as usize,
            std::mem::size_of::<Value>(),
        )?;
        return items
            .iter()
            .enumerate()
            .map(|(i, v)| json_from_js_at(&v, &format!("{what}[{i}]"), depth + 1))
            .collect::<Result<Vec<Value>>>()
            .map(Value::Array);
    }
    if js_sys::ArrayBuffer::is_view(value) && !value.is_instance_of::<js_sys::DataView>() {
        let len = get(value, "length").as_f64().unwrap_or(0.0) as usize;
        budget::check_elements(
            &format!("{what} (a typed array of {len} values)"),
            len,
            8 + std::mem::size_of::<Value>(),
        )?;
        let values = Float64Array::new(value).to_vec();
        return Ok(Value::Array(
            values.into_iter().map(number_to_json).collect(),
        ));
    }
    if looks_like_tensor(value) {
        return tensor_to_json(&tensor_from_js(value, what)?);
    }
    if value.is_instance_of::<js_sys::Map>() {
        return Err(type_error(format!(
            "{what}: a Map cannot be converted here, use a plain object"
        )));
    }
    let mut map = Map::new();
    for entry in Object::entries(value.unchecked_ref()).iter() {
        let pair: &Array = entry.unchecked_ref();
        let key = pair.get(0).as_string().unwrap_or_default();
        let item = json_from_js_at(&pair.get(1), &format!("{what}.{key}"), depth + 1)?;
        map.insert(key, item);
    }
    Ok(Value::Object(map))
}

/// Whether a JSON object is a golden-format tensor.
fn is_json_tensor(map: &Map<String, Value>) -> bool {
    map.get("dtype").is_some_and(Value::is_string)
        && map.get("shape").is_some_and(Value::is_array)
        && map.get("data").is_some_and(Value::is_array)
}

/// A JSON value (a state dict) as a plain JS value; its tensors become `{dtype, shape, data}`
/// with typed-array data.
pub(crate) fn json_to_js(value: &Value) -> Result<JsValue> {
    Ok(match value {
        Value::Null => JsValue::NULL,
        Value::Bool(b) => JsValue::from_bool(*b),
        Value::Number(n) => JsValue::from_f64(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => JsValue::from_str(s),
        Value::Array(items) => items
            .iter()
            .map(json_to_js)
            .collect::<Result<Array>>()?
            .into(),
        Value::Object(map) if is_json_tensor(map) => {
            tensor_to_js(&tensor_from_json(value, "tensor")?)?
        }
        Value::Object(map) => {
            let obj = Object::new();
            for (key, item) in map {
                set(&obj, key, json_to_js(item)?);
            }
            obj.into()
        }
    })
}

/// A `{parameter_replicas, gradient_replicas, learning_rate}` step request from JS, read and
/// checked by the library's reader (`step::read_replicas`) in the reference order, so that the
/// first defect found is the one the JSON and typed front ends report too: counts, then for
/// each parameter and rank its dtype, shape, gradient dtype and gradient shape.
pub(crate) fn step_request(
    parameter_replicas: &JsValue,
    gradient_replicas: &JsValue,
    learning_rate: &JsValue,
) -> Result<StepRequest> {
    let params = array(parameter_replicas, "parameterReplicas")?;
    let grads = array(gradient_replicas, "gradientReplicas")?;
    let learning_rate = number(learning_rate, "learningRate")?;
    let (parameter_replicas, gradient_replicas) = read_replicas(&mut JsSource {
        params,
        grads,
        param_lists: Vec::new(),
        grad_lists: Vec::new(),
    })?;
    Ok(StepRequest {
        parameter_replicas,
        gradient_replicas,
        learning_rate,
    })
}

/// A request's replica lists as JS arrays.
struct JsSource {
    params: Array,
    grads: Array,
    param_lists: Vec<Array>,
    grad_lists: Vec<Array>,
}

impl StepSource for JsSource {
    type Item = Tensor;
    fn ranks(&mut self) -> (usize, usize) {
        (self.params.length() as usize, self.grads.length() as usize)
    }
    fn counts(&mut self, rank: usize) -> Result<(usize, usize)> {
        let params = array(
            &self.params.get(rank as u32),
            &format!("parameterReplicas[{rank}]"),
        )?;
        let grads = array(
            &self.grads.get(rank as u32),
            &format!("gradientReplicas[{rank}]"),
        )?;
        let counts = (params.length() as usize, grads.length() as usize);
        self.param_lists.push(params);
        self.grad_lists.push(grads);
        Ok(counts)
    }
    fn param(&mut self, rank: usize, j: usize) -> Result<Tensor> {
        let what = format!("parameter {j} of rank {rank}");
        let param = tensor_or_dtype(&self.param_lists[rank].get(j as u32), &what)?
            .map_err(|name| errors::unsupported_dtype("parameter", &name, j, rank))?;
        Ok(param)
    }
    fn grad(&mut self, rank: usize, j: usize) -> Result<Option<Tensor>> {
        let g = self.grad_lists[rank].get(j as u32);
        if g.is_null() || g.is_undefined() {
            return Ok(None);
        }
        let what = format!("gradient {j} of rank {rank}");
        tensor_or_dtype(&g, &what)?
            .map(Some)
            .map_err(|name| errors::unsupported_dtype("gradient", &name, j, rank))
    }
    fn shape(item: &Tensor) -> &[usize] {
        item.shape()
    }
}
