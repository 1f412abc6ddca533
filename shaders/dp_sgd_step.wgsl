// #import packing
//
// The synchronous data-parallel SGD step over one chunk of a replica arena.
//
// Per element i:  acc = sum_r grad[r][i] (f32, rank order, from +0.0)
//                 mean = round_P(acc / R)            (a true division)
//                 param[r][i] = round_P(param[0][i] - lr * mean) for every rank r
// Missing gradients are zeros in the arena: adding +0.0 leaves every accumulator value intact
// (the accumulator is never -0.0, since it starts at +0.0).
//
// One invocation handles eight consecutive elements, read and written as whole vec4<u32>
// words (two for float32, one for the packed 16-bit formats): wide accesses and few
// invocations, which is what memory-bound kernels need on every adapter.

override PARAM_FORMAT: u32 = 0u;
override GRAD_FORMAT: u32 = 0u;

// `struct StepUniforms` is declared in front of this file from the Rust side (`DP_SGD_STEP` in
// src/backend/gpu/contract.rs, whose `StepUniforms` documents the fields).

@group(0) @binding(0) var<uniform> step: StepUniforms;
@group(0) @binding(1) var<storage, read> grads: array<vec4<u32>>; // #arena GRAD_FORMAT
@group(0) @binding(2) var<storage, read_write> params: array<vec4<u32>>; // #arena PARAM_FORMAT
@group(0) @binding(3) var<storage, read_write> means: array<vec4<u32>>;
// `// #arena <FORMAT>`: the assembler generates load_<binding> (and, read_write, store_<binding>)
// for the packed arena, in that storage format (src/backend/gpu/bindings.rs).

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(id: Invocation) {
    let octet = pair_index(id);
    if (octet >= step.octets) {
        return;
    }
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    for (var rank = 0u; rank < step.ranks; rank = rank + 1u) {
        let g = load_grads(rank * step.grad_rank_quads, octet);
        lo = lo + g.lo;
        hi = hi + g.hi;
    }
    let mean = Eight(round4(PARAM_FORMAT, lo / step.divisor), round4(PARAM_FORMAT, hi / step.divisor));
    let p0 = load_params(0u, octet);
    let updated = Eight(
        round4(PARAM_FORMAT, p0.lo - step.learning_rate * mean.lo),
        round4(PARAM_FORMAT, p0.hi - step.learning_rate * mean.hi),
    );
    if (PARAM_FORMAT == FORMAT_F32) {
        means[2u * octet] = bitcast<vec4<u32>>(mean.lo);
        means[2u * octet + 1u] = bitcast<vec4<u32>>(mean.hi);
        let lo_bits = bitcast<vec4<u32>>(updated.lo);
        let hi_bits = bitcast<vec4<u32>>(updated.hi);
        for (var rank = 0u; rank < step.ranks; rank = rank + 1u) {
            let i = rank * step.param_rank_quads + 2u * octet;
            params[i] = lo_bits;
            params[i + 1u] = hi_bits;
        }
    } else {
        means[octet] = pack_eight(PARAM_FORMAT, mean);
        let packed = pack_eight(PARAM_FORMAT, updated);
        for (var rank = 0u; rank < step.ranks; rank = rank + 1u) {
            params[rank * step.param_rank_quads + octet] = packed;
        }
    }
}
