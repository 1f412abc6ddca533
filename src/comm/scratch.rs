//! Scratch buffers that the worlds holding one rank per process (`MpiWorld`, `NatsWorld`) keep
//! between calls, viewed as the element type of each collective.

/// The first `len` elements of a scratch buffer viewed as `T`, growing it as needed (`u64`
/// storage keeps every `T` used here aligned).
pub(crate) fn scratch_of<T: bytemuck::Pod>(buffer: &mut Vec<u64>, len: usize) -> &mut [T] {
    let bytes = len * std::mem::size_of::<T>();
    if buffer.len() * 8 < bytes {
        buffer.resize(bytes.div_ceil(8), 0);
    }
    &mut bytemuck::cast_slice_mut(&mut buffer[..])[..len]
}
