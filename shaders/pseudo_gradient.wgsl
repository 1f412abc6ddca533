// DiLoCo's pseudo-gradient over one chunk of three arenas of one layout (parameters, the
// backup of the parameters at the last sync, gradients):
//
// Per element i:  grad[i]  = round_FORMAT(backup[i] - param[i])   (an f32 subtraction, rounded
//                                                                   once to the format)
//                 param[i] = backup[i]                            (the bits, copied)
//
// A chunk stores every rank's elements back to back, each rank a whole number of 64-element
// slots, so one flat run of eight-element groups covers every rank of the chunk. One
// invocation handles eight consecutive elements as whole vec4<u32> words (two for float32,
// one packed 16-bit word quad).

override FORMAT: u32 = 0u;

struct PseudoGradientUniforms {
    octets: u32,  // groups of eight elements in this chunk, all ranks together
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> dims: PseudoGradientUniforms;
@group(0) @binding(1) var<storage, read> backup: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> params: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> grads: array<vec4<u32>>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) workgroup: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) local_index: u32,
) {
    let octet = pair_index(workgroup, groups, local_index);
    if (octet >= dims.octets) {
        return;
    }
    if (FORMAT == FORMAT_F32) {
        let i = 2u * octet;
        let o_lo = backup[i];
        let o_hi = backup[i + 1u];
        grads[i] = bitcast<vec4<u32>>(bitcast<vec4<f32>>(o_lo) - bitcast<vec4<f32>>(params[i]));
        grads[i + 1u] = bitcast<vec4<u32>>(bitcast<vec4<f32>>(o_hi) - bitcast<vec4<f32>>(params[i + 1u]));
        params[i] = o_lo;
        params[i + 1u] = o_hi;
    } else {
        let o_words = backup[octet];
        let o = unpack_eight(FORMAT, o_words);
        let p = unpack_eight(FORMAT, params[octet]);
        grads[octet] = pack_eight(FORMAT, Eight(o.lo - p.lo, o.hi - p.hi));
        params[octet] = o_words;
    }
}
