// Shared by every kernel: how the storage formats are read and written.
//
// Formats (the `override` constants of each kernel take these values):
//   0 = float32, one per word; 1 = float16, 2 = bfloat16, two per word, element 2k in the low half.
//
// Writes round with integer operations instead of pack2x16float, because WGSL leaves the
// rounding of f32 -> f16 and the result outside the finite range to the implementation: this
// way every adapter stores the bits PyTorch stores (round to nearest even, overflow to +-inf,
// subnormals kept). Reads decode with integer operations too, so no adapter can flush a
// float16 subnormal on the way in.

// FORMAT_F32, FORMAT_F16 and FORMAT_BF16 (these codes) and WORKGROUP_SIZE are declared in front
// of this file from the Rust side (`PACKING` in src/backend/gpu/contract.rs).

fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let exponent = (h >> 10u) & 0x1fu;
    let mantissa = h & 0x3ffu;
    if (exponent == 0u) {
        // Zero or subnormal: mantissa * 2^-24, exact in f32 (the result is a normal f32).
        let magnitude = f32(mantissa) * 5.9604644775390625e-8;
        return bitcast<f32>(bitcast<u32>(magnitude) | sign);
    }
    if (exponent == 0x1fu) {
        return bitcast<f32>(sign | 0x7f800000u | (mantissa << 13u));
    }
    return bitcast<f32>(sign | ((exponent + 112u) << 23u) | (mantissa << 13u));
}

fn f32_to_f16_bits(value: f32) -> u32 {
    let bits = bitcast<u32>(value);
    let sign = (bits >> 16u) & 0x8000u;
    let exponent = (bits >> 23u) & 0xffu;
    let mantissa = bits & 0x7fffffu;
    if (exponent == 0xffu) {
        if (mantissa != 0u) {
            return sign | 0x7e00u; // canonical quiet NaN, as c10 writes it
        }
        return sign | 0x7c00u;
    }
    let half_exponent = i32(exponent) - 112; // biased for binary16
    if (half_exponent >= 31) {
        return sign | 0x7c00u;
    }
    var full: u32;
    var shift: u32;
    if (half_exponent <= 0) {
        if (half_exponent < -10) {
            return sign; // below half the smallest subnormal: rounds to zero
        }
        full = mantissa | 0x800000u;
        shift = u32(14 - half_exponent);
    } else {
        full = mantissa;
        shift = 13u;
    }
    var quotient = full >> shift;
    let remainder = full & ((1u << shift) - 1u);
    let halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (quotient & 1u) == 1u)) {
        quotient = quotient + 1u; // a carry into the exponent is the correct encoding (up to inf)
    }
    if (half_exponent <= 0) {
        return sign | quotient;
    }
    return sign | ((u32(half_exponent) << 10u) + quotient);
}

fn f32_to_bf16_bits(value: f32) -> u32 {
    let bits = bitcast<u32>(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fc0u;
    }
    return (bits + 0x7fffu + ((bits >> 16u) & 1u)) >> 16u;
}

fn decode_half(format: u32, bits: u32) -> f32 {
    if (format == FORMAT_F16) {
        return f16_bits_to_f32(bits);
    }
    return bitcast<f32>(bits << 16u);
}

fn encode_half(format: u32, value: f32) -> u32 {
    if (format == FORMAT_F16) {
        return f32_to_f16_bits(value);
    }
    return f32_to_bf16_bits(value);
}

// Two consecutive 16-bit elements of one word.
fn unpack_pair(format: u32, word: u32) -> vec2<f32> {
    return vec2<f32>(decode_half(format, word & 0xffffu), decode_half(format, word >> 16u));
}

fn pack_pair(format: u32, pair: vec2<f32>) -> u32 {
    return encode_half(format, pair.x) | (encode_half(format, pair.y) << 16u);
}

// `value` rounded to `format` and widened back: what a later f32 read of the stored value sees.
fn round_pair(format: u32, pair: vec2<f32>) -> vec2<f32> {
    if (format == FORMAT_F32) {
        return pair;
    }
    return unpack_pair(format, pack_pair(format, pair));
}

// Each kernel repeats small load/store helpers per binding: core WGSL (as browsers accept it)
// cannot pass a storage-buffer pointer to a function, so a helper can only name its binding.
//
// Memory-bound kernels handle eight consecutive elements per invocation, read and written as
// whole vec4<u32> words: two for float32, one for the packed 16-bit formats.
struct Eight {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn unpack_eight(format: u32, words: vec4<u32>) -> Eight {
    return Eight(
        vec4<f32>(unpack_pair(format, words.x), unpack_pair(format, words.y)),
        vec4<f32>(unpack_pair(format, words.z), unpack_pair(format, words.w)),
    );
}

fn pack_eight(format: u32, values: Eight) -> vec4<u32> {
    return vec4<u32>(
        pack_pair(format, values.lo.xy),
        pack_pair(format, values.lo.zw),
        pack_pair(format, values.hi.xy),
        pack_pair(format, values.hi.zw),
    );
}

fn round4(format: u32, v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(round_pair(format, v.xy), round_pair(format, v.zw));
}


// Every kernel runs one invocation per element group, 256 per workgroup, on a 2-D grid so that
// more than 65,535 workgroups fit (the host spreads them over x and y): WORKGROUP_SIZE.

// The built-in values every kernel's entry point takes.
struct Invocation {
    @builtin(workgroup_id) workgroup: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) local_index: u32,
}

// The invocation's index in the flattened grid.
fn pair_index(id: Invocation) -> u32 {
    return (id.workgroup.y * id.groups.x + id.workgroup.x) * WORKGROUP_SIZE + id.local_index;
}
