// #import packing
//
// The shader-copy roofline: copies one chunk of an arena to another with the kernels' own
// access pattern (one invocation per eight float32 elements, read and written as two
// vec4<u32> words, 256 invocations per workgroup on the same 2-D grid). What a memory-bound
// kernel can reach on an adapter is this figure, not the adapter's buffer-to-buffer copy
// (often a DMA engine or a memcpy, which no shader matches). Benchmarks only.

// `struct CopyUniforms` (`octets`: groups of eight float32 elements, two vec4<u32> words, in
// this chunk) is declared in front of this file from the Rust side (`COPY` in
// src/backend/gpu/contract.rs).

@group(0) @binding(0) var<uniform> copy: CopyUniforms;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(id: Invocation) {
    let octet = pair_index(id);
    if (octet >= copy.octets) {
        return;
    }
    dst[2u * octet] = src[2u * octet];
    dst[2u * octet + 1u] = src[2u * octet + 1u];
}
