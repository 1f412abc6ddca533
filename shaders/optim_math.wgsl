// #import packing
//
// The arithmetic the optimizer kernels share (sgd.wgsl, adam.wgsl import it). It reads the
// kernel's `FORMAT` override. A kernel calls `begin_update` before any of these run.

// Set per invocation: a fused update (PyTorch's `fused=True`) rounds only when it stores.
var<private> fused: bool;

// `a * b + c` rounded once (IEEE fusedMultiplyAdd), from float32 operations that each round
// once: WGSL's `fma` may round twice (lavapipe's does). The product's exact error comes from
// Veltkamp's split (Dekker's TwoProduct), the sum's from Knuth's TwoSum; the two errors are
// added rounding to odd, then to the sum (Boldo and Melquiond's proved emulation). Outside the
// range where the split is exact (a product, factor or addend of 2^100 or more, a
// non-finite operand) and for a product below 2^-60 (where the error terms could leave the
// normal range) it is `a * b + c`. The twin of the
// `mul_add` of `adam_rank`/`sgd_rank` in src/backend/kernels/{adam,sgd}.rs.
// 1.0, from a value the compiler cannot see (set by `begin_update`): `x * one` keeps a shader compiler
// from rewriting the error-free transformations algebraically (Mesa's NIR does, on
// lavapipe: `(a + b) - a` is not `b` in floating point).
var<private> one: f32;

// Sets `fused` and `one` for this invocation's update: `flags` is the kernel's flag word, in
// which no flag has bit 31, so `one` is 1.0 by a value no compiler can prove.
fn begin_update(is_fused: bool, flags: u32) {
    fused = is_fused;
    one = bitcast<f32>(0x3f800000u | (flags >> 31u));
}

fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = a + b;
    let bb = s * one - a;
    return vec2<f32>(s, (a - (s - bb)) + (b - bb));
}

fn split(a: f32) -> vec2<f32> {
    let t = 4097.0 * a;
    let hi = t - (t * one - a);
    return vec2<f32>(hi, a - hi);
}

fn exact_fma1(a: f32, b: f32, c: f32) -> f32 {
    let p = a * b;
    let big = 1.2676506e30; // 2^100
    let small = 8.6736174e-19; // 2^-60
    let ap = abs(p);
    let ac = abs(c);
    if (!(ap < big && ac < big) || (ap < small && p != 0.0) || abs(a) >= big || abs(b) >= big) {
        return p + c;
    }
    let x = split(a);
    let y = split(b);
    let e = ((x.x * y.x - p) + x.x * y.y + x.y * y.x) + x.y * y.y;
    let t = two_sum(c, p);
    let u = two_sum(t.y, e);
    var v = u.x;
    if (v == 0.0) {
        return t.x;
    }
    // Round to odd: an inexact sum with an even significand moves one unit toward its error.
    let bits = bitcast<u32>(v);
    if (u.y != 0.0 && (bits & 1u) == 0u) {
        if ((u.y > 0.0) == (v > 0.0)) {
            v = bitcast<f32>(bits + 1u);
        } else {
            v = bitcast<f32>(bits - 1u);
        }
    }
    return t.x + v;
}

fn exact_fma(a: vec4<f32>, b: vec4<f32>, c: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(
        exact_fma1(a.x, b.x, c.x),
        exact_fma1(a.y, b.y, c.y),
        exact_fma1(a.z, b.z, c.z),
        exact_fma1(a.w, b.w, c.w),
    );
}

// A tensor operation's result rounded to the storage format, or kept in float32 under `fused`.
fn r(x: vec4<f32>) -> vec4<f32> {
    if (FORMAT == FORMAT_F32 || fused) {
        return x;
    }
    return round4(FORMAT, x);
}

// `x.add(y, alpha=alpha)` as PyTorch's CPU kernel computes it on four elements of a parameter,
// the first its element `first`: one fused multiply-add (`exact_fma`) for float32 and under
// `fused` (`alpha` unrounded); for float16/bfloat16's single-tensor arithmetic, alpha rounded
// to the format, then in PyTorch's vector body (the elements before `tail_from`) one fused
// multiply-add rounded once, in its scalar tail the product rounded before the sum (see
// `add_scaled_at` in src/backend/kernels/arith.rs).
fn add_scaled(x: vec4<f32>, alpha: f32, y: vec4<f32>, first: u32, tail_from: u32) -> vec4<f32> {
    if (FORMAT == FORMAT_F32 || fused) {
        return exact_fma(y, vec4<f32>(alpha), x);
    }
    let a = r(vec4<f32>(alpha));
    let body = r(exact_fma(y, a, x));
    let tail = r(x + r(a * y));
    let lanes = vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u);
    return select(tail, body, lanes < vec4<u32>(tail_from));
}
