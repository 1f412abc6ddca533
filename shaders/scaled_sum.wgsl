// #import packing
// #import param_table
//
// The data-parallel gradient all-reduce of DistributedDataParallel, joined ranks included
// (`kernels::scaled_sum_reference` is the reference): for every element of a reduced parameter,
// the sum over all ranks, in rank order, of round(x_r * scale_r) for a rank that contributes
// to that parameter (table bit 0) and of +0 for the others; every product and partial sum is
// rounded to the ARITH precision, the sum to the arena's FORMAT, and it is written to every
// rank that receives (table bit 1). One invocation per eight elements, every rank in a loop:
// the whole world in one dispatch. Parameters whose flag is 0 are left alone.

override FORMAT: u32 = 0u;
override ARITH: u32 = 0u;

// The table bits CONTRIBUTES and RECEIVES are declared in front of this file from the Rust side
// (`SCALED_SUM` in src/backend/gpu/contract.rs).

@group(0) @binding(0) var<uniform> geometry: Dispatch;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> reduced: array<u32>;
// Per rank: the scale (float32). Per (rank, parameter), rank-major: flags.
@group(0) @binding(3) var<storage, read> scales: array<f32>;
@group(0) @binding(4) var<storage, read> table: array<u32>;
@group(0) @binding(5) var<storage, read_write> arena: array<vec4<u32>>; // #arena FORMAT
// `// #arena FORMAT`: the assembler generates load_<binding> (and, read_write, store_<binding>)
// for the packed arena, in that storage format (src/backend/gpu/bindings.rs).

fn contribution(rank: u32, j: u32, octet: u32) -> Eight {
    if ((table[rank * geometry.params + j] & CONTRIBUTES) == 0u) {
        return Eight(vec4<f32>(0.0), vec4<f32>(0.0));
    }
    let v = load_arena(rank * geometry.rank_quads, octet);
    let s = scales[rank];
    return Eight(round4(ARITH, v.lo * s), round4(ARITH, v.hi * s));
}

// One invocation: lane `lane`, eight elements at `octet`, parameter `j` (param_table's `main`).
fn run(lane: u32, octet: u32, j: u32) {
    // One lane (geometry.ranks = 1): every rank is summed in the loop below.
    if (reduced[j] == 0u) {
        return;
    }
    let ranks = geometry.group_size;
    var acc = contribution(0u, j, octet);
    for (var r = 1u; r < ranks; r = r + 1u) {
        let c = contribution(r, j, octet);
        acc = Eight(round4(ARITH, acc.lo + c.lo), round4(ARITH, acc.hi + c.hi));
    }
    let sum = Eight(round4(FORMAT, acc.lo), round4(FORMAT, acc.hi));
    for (var r = 0u; r < ranks; r = r + 1u) {
        if ((table[r * geometry.params + j] & RECEIVES) != 0u) {
            store_arena(r * geometry.rank_quads, octet, sum);
        }
    }
}
