// #import packing
// #import param_table
//
// Converts one chunk of an arena into another arena of the same layout and another storage
// format, for the parameters whose flag is set (DiLoCo's compressed pseudo-gradients):
//
// Per element i:  dst[i] = round_DST_FORMAT(src[i])   (decoded exactly to f32, rounded once
//                                                      to the destination format: round to
//                                                      nearest even, as c10 does)
//
// One invocation per (eight elements, rank), read and written as whole vec4<u32> words (two
// for float32, one packed 16-bit word quad); parameters start at multiples of 64 elements, so
// the eight elements of an invocation belong to one parameter. Both arenas share the chunk
// boundaries (`chunk_len`), so a rank's chunk holds `octets` groups of eight in either format.
// Other parameters are left alone.

override SRC_FORMAT: u32 = 0u;
override DST_FORMAT: u32 = 2u;

@group(0) @binding(0) var<uniform> geometry: Dispatch;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> converted: array<u32>;
@group(0) @binding(3) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> dst: array<vec4<u32>>;

// One invocation: lane `rank`, eight elements at `octet`, parameter `j` (param_table's `main`).
fn run(rank: u32, octet: u32, j: u32) {
    if (converted[j] == 0u) {
        return;
    }
    var v: Eight;
    if (SRC_FORMAT == FORMAT_F32) {
        let i = rank * 2u * geometry.octets + 2u * octet;
        v = Eight(bitcast<vec4<f32>>(src[i]), bitcast<vec4<f32>>(src[i + 1u]));
    } else {
        v = unpack_eight(SRC_FORMAT, src[rank * geometry.octets + octet]);
    }
    if (DST_FORMAT == FORMAT_F32) {
        let i = rank * 2u * geometry.octets + 2u * octet;
        dst[i] = bitcast<vec4<u32>>(v.lo);
        dst[i + 1u] = bitcast<vec4<u32>>(v.hi);
    } else {
        dst[rank * geometry.octets + octet] = pack_eight(DST_FORMAT, v);
    }
}
