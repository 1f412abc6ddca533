// Shared by the per-parameter kernels (optimizers, averaging): which parameter an element
// belongs to, and the dispatch geometry of one arena chunk.

struct Dispatch {
    pairs: u32,       // element pairs per rank in this chunk
    first_pair: u32,  // the chunk's first pair in the rank's element space
    rank_words: u32,  // words per rank in this chunk
    ranks: u32,       // ranks covered by the grid (SGD/Adam: every rank; averaging: groups)
    params: u32,      // parameters in the arena
    group_size: u32,  // averaging only
    _pad0: u32,
    _pad1: u32,
}

// starts[j] is parameter j's first element (ascending); a parameter runs to the next start.
// Binary search: the last j with starts[j] <= element.
fn find_param(element: u32, count: u32) -> u32 {
    var lo = 0u;
    var hi = count;
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (starts[mid] <= element) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}
