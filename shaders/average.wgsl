// Group averaging (PyTorch's model averagers and the post-local-SGD gradient hook): for every
// group of `group_size` consecutive ranks, each value is divided by the group size, the
// quotients are summed in rank order, both in the ARITH precision (PyTorch's promoted dtype of
// the flattened tensors; gloo rounds 16-bit partial sums), and the sum, rounded to the arena's
// FORMAT, is written to every rank of the group. One invocation per (pair, group): every group
// of the partition is averaged by the same dispatch. Parameters whose flag is 0 are left alone.

override FORMAT: u32 = 0u;
override ARITH: u32 = 0u;

@group(0) @binding(0) var<uniform> geometry: Dispatch;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> averaged: array<u32>;
@group(0) @binding(3) var<storage, read_write> arena: array<u32>;

fn load_value(base: u32, pair: u32) -> vec2<f32> {
    if (FORMAT == FORMAT_F32) {
        return vec2<f32>(bitcast<f32>(arena[base + 2u * pair]), bitcast<f32>(arena[base + 2u * pair + 1u]));
    }
    return unpack_pair(FORMAT, arena[base + pair]);
}

fn store_value(base: u32, pair: u32, value: vec2<f32>) {
    if (FORMAT == FORMAT_F32) {
        arena[base + 2u * pair] = bitcast<u32>(value.x);
        arena[base + 2u * pair + 1u] = bitcast<u32>(value.y);
    } else {
        arena[base + pair] = pack_pair(FORMAT, value);
    }
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) workgroup: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) local_index: u32,
) {
    let index = pair_index(workgroup, groups, local_index);
    if (index >= geometry.pairs * geometry.ranks) {
        return;
    }
    let group = index / geometry.pairs;
    let pair = index % geometry.pairs;
    let j = find_param(2u * (geometry.first_pair + pair), geometry.params);
    if (averaged[j] == 0u) {
        return;
    }
    let size = geometry.group_size;
    let divisor = f32(size);
    let first = group * size;
    var acc = round_pair(ARITH, load_value(first * geometry.rank_words, pair) / divisor);
    for (var r = 1u; r < size; r = r + 1u) {
        let quotient = round_pair(ARITH, load_value((first + r) * geometry.rank_words, pair) / divisor);
        acc = round_pair(ARITH, acc + quotient);
    }
    let mean = round_pair(FORMAT, acc);
    for (var r = 0u; r < size; r = r + 1u) {
        store_value((first + r) * geometry.rank_words, pair, mean);
    }
}
