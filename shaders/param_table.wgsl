// #import packing
//
// Shared by the per-parameter kernels (optimizers, averaging): which parameter an element
// belongs to, and the dispatch geometry of one arena chunk. The kernel declares the bindings
// `geometry: Dispatch` and `starts: array<u32>` these read. `struct Dispatch` and
// BLOCK_ELEMENTS are declared in front of this file from the Rust side (`PARAM_TABLE` in
// src/backend/gpu/contract.rs, whose `Dispatch` documents the fields).

// The parameter table: starts[j] is parameter j's first element (ascending; a parameter runs
// to the next start), for j < count; then, for every block of BLOCK_ELEMENTS elements of the
// rank space, the parameter that the block's first element belongs to. An element's parameter
// is its block's entry plus a short forward scan, whatever the number of parameters.

fn find_param(element: u32, count: u32) -> u32 {
    var j = starts[count + element / BLOCK_ELEMENTS];
    loop {
        if (j + 1u >= count || starts[j + 1u] > element) {
            break;
        }
        j = j + 1u;
    }
    return j;
}

// Where one invocation of a per-parameter kernel works: the `lane`-th of `geometry.ranks` lanes
// (ranks, or groups of ranks when averaging), its eight elements at `octet` of the chunk, and
// the parameter `param` they belong to (parameters start at multiples of 64 elements, so the
// eight share one). `valid` is false past the end of the grid.
struct Place {
    valid: bool,
    lane: u32,
    octet: u32,
    param: u32,
}

fn place(id: Invocation) -> Place {
    let index = pair_index(id);
    if (index >= geometry.octets * geometry.ranks) {
        return Place(false, 0u, 0u, 0u);
    }
    let octet = index % geometry.octets;
    return Place(true, index / geometry.octets, octet, find_param(8u * (geometry.first_octet + octet), geometry.params));
}

// The entry point of every kernel that imports this file: the kernel defines
// `fn run(lane: u32, octet: u32, param: u32)`, called once for each invocation on the grid.
@compute @workgroup_size(WORKGROUP_SIZE)
fn main(id: Invocation) {
    let at = place(id);
    if (at.valid) {
        run(at.lane, at.octet, at.param);
    }
}
