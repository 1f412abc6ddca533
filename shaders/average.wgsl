// #import packing
// #import param_table
//
// Group averaging (PyTorch's model averagers and the post-local-SGD gradient hook): for every
// group of `group_size` consecutive ranks, each value is divided by the group size, the
// quotients are summed in rank order, both in the ARITH precision (PyTorch's promoted dtype of
// the flattened tensors; gloo rounds 16-bit partial sums), and the sum, rounded to the arena's
// FORMAT, is written to every rank of the group. With SUM_FIRST (DiLoCo's all-reduce, as
// torchft's: SUM, then the division) the values are summed and the sum divided instead. One
// invocation per (pair, group): every group of the partition is averaged by the same dispatch.
// Parameters whose flag is 0 are left alone.

override FORMAT: u32 = 0u;
// 0: each value divided, then summed (`MeanOrder::DivideThenSum`); 1: summed, then divided.
override SUM_FIRST: u32 = 0u;
override ARITH: u32 = 0u;

@group(0) @binding(0) var<uniform> geometry: Dispatch;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> averaged: array<u32>;
@group(0) @binding(3) var<storage, read_write> arena: array<vec4<u32>>; // #arena FORMAT
// `// #arena FORMAT`: the assembler generates load_<binding> (and, read_write, store_<binding>)
// for the packed arena, in that storage format (src/backend/gpu/bindings.rs).

// `v / divisor`, rounded to ARITH; as `v * scale` when the divisor is a power of two and
// `scale` its reciprocal: the same number, exactly, where WGSL lets a division be 2.5 ulp off,
// and cheaper.
fn divided(v: Eight, divisor: f32, scale: f32) -> Eight {
    if (scale != 0.0) {
        return Eight(round4(ARITH, v.lo * scale), round4(ARITH, v.hi * scale));
    }
    return Eight(round4(ARITH, v.lo / divisor), round4(ARITH, v.hi / divisor));
}

// A rank's eight values as the sum takes them: divided first, or only rounded to ARITH.
fn addend(rank: u32, octet: u32, divisor: f32, scale: f32) -> Eight {
    let v = load_arena(rank * geometry.rank_quads, octet);
    if (SUM_FIRST != 0u) {
        return Eight(round4(ARITH, v.lo), round4(ARITH, v.hi));
    }
    return divided(v, divisor, scale);
}

// One invocation: lane `group`, eight elements at `octet`, parameter `j` (param_table's `main`).
fn run(group: u32, octet: u32, j: u32) {
    if (averaged[j] == 0u) {
        return;
    }
    let size = geometry.group_size;
    let divisor = f32(size);
    // 2^-k for a size of 2^k, built from its bits (exact on every adapter); 0 otherwise.
    let power_of_two = (size & (size - 1u)) == 0u;
    let scale = select(0.0, bitcast<f32>((127u - countTrailingZeros(size)) << 23u), power_of_two);
    let first = group * size;
    var acc = addend(first, octet, divisor, scale);
    for (var r = 1u; r < size; r = r + 1u) {
        let q = addend(first + r, octet, divisor, scale);
        acc = Eight(round4(ARITH, acc.lo + q.lo), round4(ARITH, acc.hi + q.hi));
    }
    if (SUM_FIRST != 0u) {
        acc = divided(acc, divisor, scale);
    }
    let mean = Eight(round4(FORMAT, acc.lo), round4(FORMAT, acc.hi));
    for (var r = 0u; r < size; r = r + 1u) {
        store_arena((first + r) * geometry.rank_quads, octet, mean);
    }
}
