// #import packing
// #import param_table
//
// DiLoCo's pseudo-gradient over one chunk of three arenas of one layout (parameters, the
// backup of the parameters at the last sync, gradients), for the parameters whose flag is set:
//
// Per element i:  grad[i]  = round_FORMAT(backup[i] - param[i])   (an f32 subtraction, rounded
//                                                                   once to the format)
//                 param[i] = backup[i]                            (the bits, copied)
//
// One invocation per (eight elements, rank), read and written as whole vec4<u32> words (two
// for float32, one packed 16-bit word quad); parameters start at multiples of 64 elements, so
// the eight elements of an invocation belong to one parameter. Other parameters are left
// alone in all three arenas.

override FORMAT: u32 = 0u;

@group(0) @binding(0) var<uniform> geometry: Dispatch;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> synced: array<u32>;
@group(0) @binding(3) var<storage, read> backup: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> params: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> grads: array<vec4<u32>>;

// One invocation: lane `rank`, eight elements at `octet`, parameter `j` (param_table's `main`).
fn run(rank: u32, octet: u32, j: u32) {
    if (synced[j] == 0u) {
        return;
    }
    let base = rank * geometry.rank_quads;
    if (FORMAT == FORMAT_F32) {
        let i = base + 2u * octet;
        let o_lo = backup[i];
        let o_hi = backup[i + 1u];
        grads[i] = bitcast<vec4<u32>>(bitcast<vec4<f32>>(o_lo) - bitcast<vec4<f32>>(params[i]));
        grads[i + 1u] = bitcast<vec4<u32>>(bitcast<vec4<f32>>(o_hi) - bitcast<vec4<f32>>(params[i + 1u]));
        params[i] = o_lo;
        params[i + 1u] = o_hi;
    } else {
        let i = base + octet;
        let o_words = backup[i];
        let o = unpack_eight(FORMAT, o_words);
        let p = unpack_eight(FORMAT, params[i]);
        grads[i] = pack_eight(FORMAT, Eight(o.lo - p.lo, o.hi - p.hi));
        params[i] = o_words;
    }
}
