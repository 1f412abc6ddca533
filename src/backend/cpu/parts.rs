//! The CPU backend's optimizer and averaging kernels: one fused pass over memory per step, split
//! into equal element ranges across the host's threads, with the per-(rank, parameter) choices
//! hoisted out of the element loops so that the loops vectorize (AVX2 on x86-64 when present).
//!
//! They compute exactly what the reference kernels in [`super::kernels`] compute, operation by
//! operation (the same IEEE float32 operations in the same order, each PyTorch tensor
//! operation's result rounded to the storage format), so the two agree bit for bit; the
//! reference stays the readable twin every backend is tested against. float32 runs on the
//! arena's words in place; float16 and bfloat16 run the same loops over the arena's 16-bit
//! elements in place ([`Storage`]): each element is widened to float32 as it is loaded, every
//! tensor operation's result is rounded to the format, and the rounded value is stored back, in
//! one pass. float64 arenas, and arenas whose layout is not slot-aligned, run the reference.

use super::half::{BFloat16, Binary16, HalfFormat};
use super::threads::run_parts;
use crate::backend::kernels::{
    self, AdamArenas, AdamScalars, ParamStarts, SgdScalars, host_words, host_words_mut,
};
use crate::backend::quotient::{ByDivision, ByScale, Divide, Quotient};
use crate::backend::{Arena, PARAM_ALIGN_ELEMENTS};
use crate::dtype::StorageFormat;
use crate::error::Result;

/// Elements per thread below which fewer threads are used (spawning costs more than it saves).
const MIN_PART_ELEMENTS: usize = 1 << 15;

/// A run of one (rank, parameter)'s elements inside one part.
#[derive(Clone, Copy, Debug)]
struct Segment {
    /// Index into the scalar table (rank-major).
    entry: usize,
    /// First element, counted from the part's first element in the arena's flat
    /// `[rank][element]` space.
    first: usize,
    /// Elements.
    len: usize,
}

/// The work of one step split into parts: part `k` covers flat elements
/// `bounds[k]..bounds[k + 1]` (slot-aligned, so 16-bit parts start on a word) and the listed
/// segments inside them.
struct Plan {
    bounds: Vec<usize>,
    parts: Vec<Vec<Segment>>,
}

/// Splits the active (rank, parameter) runs into at most `threads` parts of nearly equal
/// element counts. `None` when the arena's layout is not slot-aligned (the caller falls back to
/// the reference).
fn plan(
    ranks: usize,
    rank_len: usize,
    starts: &ParamStarts,
    active: impl Fn(usize) -> bool,
    threads: usize,
) -> Option<Plan> {
    let count = starts.0.len();
    if !rank_len.is_multiple_of(PARAM_ALIGN_ELEMENTS)
        || starts
            .0
            .iter()
            .any(|&s| !(s as usize).is_multiple_of(PARAM_ALIGN_ELEMENTS) || s as usize > rank_len)
    {
        return None;
    }
    // Every active run, in flat order.
    let mut runs = Vec::new();
    for rank in 0..ranks {
        for j in 0..count {
            let entry = rank * count + j;
            if !active(entry) {
                continue;
            }
            let start = starts.0[j] as usize;
            let end = starts.0.get(j + 1).map_or(rank_len, |&e| e as usize);
            if end > start {
                runs.push((entry, rank * rank_len + start, end - start));
            }
        }
    }
    let total: usize = runs.iter().map(|r| r.2).sum();
    let parts = threads
        .min(total / MIN_PART_ELEMENTS)
        .clamp(1, threads.max(1));
    let target = total.div_ceil(parts);
    let mut bounds = vec![0];
    let mut out: Vec<Vec<Segment>> = vec![Vec::new()];
    let mut filled = 0;
    for (entry, mut first, mut len) in runs {
        while len > 0 {
            let room = target.saturating_sub(filled);
            // Close the part when it is full and another part may still start.
            if room == 0 && out.len() < parts {
                let at = first;
                bounds.push(at);
                out.push(Vec::new());
                filled = 0;
                continue;
            }
            let take = if out.len() < parts && room < len {
                // Split inside the run at a slot boundary (at least one slot).
                room.div_ceil(PARAM_ALIGN_ELEMENTS) * PARAM_ALIGN_ELEMENTS
            } else {
                len
            }
            .min(len);
            let base = *bounds.last().unwrap_or(&0);
            if let Some(part) = out.last_mut() {
                part.push(Segment {
                    entry,
                    first: first - base,
                    len: take,
                });
            }
            filled += take;
            first += take;
            len -= take;
        }
    }
    bounds.push(ranks * rank_len);
    Some(Plan { bounds, parts: out })
}

/// Splits `words` (the flat arena) into the parts' word ranges (`bounds` are element
/// indices, slot-aligned).
pub(super) fn split_words<'a>(
    mut words: &'a mut [u32],
    format: StorageFormat,
    bounds: &[usize],
) -> Vec<&'a mut [u32]> {
    let mut out = Vec::with_capacity(bounds.len().saturating_sub(1));
    for pair in bounds.windows(2) {
        let len = (format.word_of(pair[1]) - format.word_of(pair[0])).min(words.len());
        let (head, tail) = std::mem::take(&mut words).split_at_mut(len);
        out.push(head);
        words = tail;
    }
    out
}

fn split_words_ref<'a>(
    mut words: &'a [u32],
    format: StorageFormat,
    bounds: &[usize],
) -> Vec<&'a [u32]> {
    let mut out = Vec::with_capacity(bounds.len().saturating_sub(1));
    for pair in bounds.windows(2) {
        let len = format.word_of(pair[1]) - format.word_of(pair[0]);
        let (head, tail) = words.split_at(len.min(words.len()));
        out.push(head);
        words = tail;
    }
    out
}

fn split_optional<'a>(
    words: Option<&'a mut [u32]>,
    format: StorageFormat,
    bounds: &[usize],
) -> Vec<Option<&'a mut [u32]>> {
    match words {
        Some(w) => split_words(w, format, bounds)
            .into_iter()
            .map(Some)
            .collect(),
        None => (1..bounds.len()).map(|_| None).collect(),
    }
}

/// One part's work, compiled for the best vector extension the host has by [`run_best`]. The
/// implementations mark `run` `#[inline(always)]`, so that the whole loop nest is compiled
/// inside the AVX2 function (a closure would be a separate function LLVM may not inline).
pub(super) trait PartWork {
    fn run(self);
}

/// Runs `work` compiled for AVX-512 (with its byte/word and 256-bit forms) or AVX2 when the
/// host has it (the same IEEE operations, wider vectors), otherwise for the baseline target.
/// Both come with FMA, so that the `fused=True` kernels' `mul_add`s are single instructions
/// (Rust never contracts a product and a sum by itself: the other kernels' results do not
/// depend on it); a host with AVX2 but no FMA takes the baseline.
pub(super) fn run_best<W: PartWork>(work: W) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
        fn avx512<W: PartWork>(work: W) {
            work.run()
        }
        #[target_feature(enable = "avx2,fma")]
        fn avx2<W: PartWork>(work: W) {
            work.run()
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the host supports every feature enabled (checked just above).
            unsafe { avx512(work) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the host supports AVX2 and FMA (checked just above).
            unsafe { avx2(work) };
            return;
        }
    }
    work.run()
}

// The packed 16-bit arenas are read as `u16` slices: element `2k` is the low half of word `k`.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "16-bit arenas are read as u16 slices"
);

/// How the element loops read and write one storage format, and round a tensor operation's
/// float32 result to it. Every loop computes in float32.
trait Storage: Copy {
    /// One element as the arena stores it.
    type Elem: bytemuck::Pod;
    /// PyTorch's `fused=True` arithmetic: the multiply-adds its fused kernels single-round
    /// are fused multiply-adds here (see `sgd_rank` and `adam_rank` in [`super::kernels`]).
    const FUSED: bool = false;
    /// A tensor operation's float32 result rounded to the format.
    fn r(self, x: f32) -> f32;
    /// An element, widened to float32 (exact).
    fn load(self, e: Self::Elem) -> f32;
    /// A value already rounded by [`r`](Self::r), as the arena stores it (exact).
    fn store(self, x: f32) -> Self::Elem;
}

/// float32 storage: the result is already rounded.
#[derive(Clone, Copy)]
struct Exact;
impl Storage for Exact {
    type Elem = f32;
    #[inline(always)]
    fn r(self, x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn load(self, e: f32) -> f32 {
        e
    }
    #[inline(always)]
    fn store(self, x: f32) -> f32 {
        x
    }
}

/// float32 storage under PyTorch's `fused=True`: [`Exact`] with its multiply-adds fused.
#[derive(Clone, Copy)]
struct ExactFused;
impl Storage for ExactFused {
    type Elem = f32;
    const FUSED: bool = true;
    #[inline(always)]
    fn r(self, x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn load(self, e: f32) -> f32 {
        e
    }
    #[inline(always)]
    fn store(self, x: f32) -> f32 {
        x
    }
}

/// A 16-bit storage format, read and written in place: decoded on load, rounded after every
/// tensor operation, encoded on store.
#[derive(Clone, Copy)]
struct To<H>(std::marker::PhantomData<H>);
impl<H: HalfFormat + Copy> Storage for To<H> {
    type Elem = u16;
    #[inline(always)]
    fn r(self, x: f32) -> f32 {
        H::round(x)
    }
    #[inline(always)]
    fn load(self, e: u16) -> f32 {
        H::decode(u32::from(e))
    }
    #[inline(always)]
    fn store(self, x: f32) -> u16 {
        H::encode_rounded(x) as u16
    }
}

/// A 16-bit storage format under PyTorch's `fused=True`: decoded on load, computed in float32
/// without rounding (its multiply-adds fused), rounded to the format once, as it is stored.
#[derive(Clone, Copy)]
struct Opmath<H>(std::marker::PhantomData<H>);
impl<H: HalfFormat + Copy> Storage for Opmath<H> {
    type Elem = u16;
    const FUSED: bool = true;
    #[inline(always)]
    fn r(self, x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn load(self, e: u16) -> f32 {
        H::decode_operand(u32::from(e))
    }
    #[inline(always)]
    fn store(self, x: f32) -> u16 {
        H::encode(x) as u16
    }
}

/// A segment's elements of a part's words, as the format's elements (empty for an absent
/// arena).
#[inline(always)]
fn rows_mut<'a, T: bytemuck::Pod>(words: &'a mut [u32], seg: &Segment) -> &'a mut [T] {
    if words.is_empty() {
        &mut []
    } else {
        &mut bytemuck::cast_slice_mut::<u32, T>(words)[seg.first..seg.first + seg.len]
    }
}

/// A segment's elements of a part's (read-only) words.
#[inline(always)]
fn rows<'a, T: bytemuck::Pod>(words: &'a [u32], seg: &Segment) -> &'a [T] {
    &bytemuck::cast_slice::<u32, T>(words)[seg.first..seg.first + seg.len]
}

/// `-g` when maximizing: a sign flip, as `-grad` is.
#[inline(always)]
fn signed(g: f32, flip: u32) -> f32 {
    f32::from_bits(g.to_bits() ^ flip)
}

// ---------------------------------------------------------------------------------------------
// SGD.

/// One (rank, parameter)'s SGD constants in float32.
#[derive(Clone, Copy)]
struct Sgd {
    flip: u32,
    neg_lr: f32,
    wd: f32,
    momentum: f32,
    momentum_alpha: f32,
    damp: f32,
}

impl Sgd {
    /// The constants as the kernel uses them: the scalars of `add(alpha=)` rounded to the
    /// storage format (see [`add_scaled`]); `mul_(momentum)` takes its scalar unrounded.
    fn of<S: Storage>(s: &SgdScalars, rnd: S) -> Sgd {
        Sgd {
            flip: if s.maximize { 0x8000_0000 } else { 0 },
            neg_lr: rnd.r(-s.lr as f32),
            wd: rnd.r(s.weight_decay as f32),
            momentum: s.momentum as f32,
            momentum_alpha: rnd.r(s.momentum as f32),
            damp: rnd.r(s.one_minus_dampening as f32),
        }
    }
}

/// PyTorch's `x.add(y, alpha=alpha)` on one element, `alpha` already rounded to the format:
/// the product and the sum each rounded to the storage format (the reference's
/// `kernels::add_scaled`; one product and one sum for float32).
#[inline(always)]
fn add_scaled<S: Storage>(rnd: S, x: f32, alpha: f32, y: f32) -> f32 {
    rnd.r(x + rnd.r(alpha * y))
}

/// The SGD update of `sgd_rank` in [`super::kernels`], element by element. `MOM`: 0 no
/// momentum buffer, 1 first step (the buffer starts as the gradient), 2 a running buffer.
#[inline(always)]
fn sgd_block<const WD: bool, const MOM: u8, const NESTEROV: bool, S: Storage>(
    c: Sgd,
    st: S,
    p: &mut [S::Elem],
    g: &[S::Elem],
    b: &mut [S::Elem],
) {
    let r = |x| st.r(x);
    let add = |x, alpha, y| add_scaled(st, x, alpha, y);
    let n = p.len().min(g.len());
    let (p, g) = (&mut p[..n], &g[..n]);
    if S::FUSED {
        sgd_block_fused::<WD, MOM, NESTEROV, S>(c, st, p, g, b);
        return;
    }
    if MOM == 0 {
        for (p, &g) in p.iter_mut().zip(g) {
            let param = st.load(*p);
            let mut grad = signed(st.load(g), c.flip);
            if WD {
                grad = add(grad, c.wd, param);
            }
            *p = st.store(add(param, c.neg_lr, grad));
        }
        return;
    }
    let b = &mut b[..n];
    for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
        let param = st.load(*p);
        let mut grad = signed(st.load(g), c.flip);
        if WD {
            grad = add(grad, c.wd, param);
        }
        let buf = if MOM == 1 {
            grad
        } else {
            add(r(st.load(*b) * c.momentum), c.damp, grad)
        };
        *b = st.store(buf);
        grad = if NESTEROV {
            add(grad, c.momentum_alpha, buf)
        } else {
            buf
        };
        *p = st.store(add(param, c.neg_lr, grad));
    }
}

/// [`sgd_block`] under `fused=True`: the fused branch of `sgd_rank` in [`super::kernels`]
/// (float32 throughout, its multiply-adds fused, one rounding per store).
#[inline(always)]
fn sgd_block_fused<const WD: bool, const MOM: u8, const NESTEROV: bool, S: Storage>(
    c: Sgd,
    st: S,
    p: &mut [S::Elem],
    g: &[S::Elem],
    b: &mut [S::Elem],
) {
    let n = p.len().min(g.len());
    let (p, g) = (&mut p[..n], &g[..n]);
    if MOM == 0 {
        for (p, &g) in p.iter_mut().zip(g) {
            let param = st.load(*p);
            let mut grad = signed(st.load(g), c.flip);
            if WD {
                grad = param.mul_add(c.wd, grad);
            }
            *p = st.store(grad.mul_add(c.neg_lr, param));
        }
        return;
    }
    let b = &mut b[..n];
    for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
        let param = st.load(*p);
        let mut grad = signed(st.load(g), c.flip);
        if WD {
            grad = param.mul_add(c.wd, grad);
        }
        let buf = if MOM == 1 {
            grad
        } else {
            grad.mul_add(c.damp, st.load(*b) * c.momentum)
        };
        *b = st.store(buf);
        if NESTEROV {
            grad = buf.mul_add(c.momentum, grad);
        } else {
            grad = buf;
        }
        *p = st.store(grad.mul_add(c.neg_lr, param));
    }
}

#[inline(always)]
fn sgd_dispatch<S: Storage>(
    s: &SgdScalars,
    rnd: S,
    p: &mut [S::Elem],
    g: &[S::Elem],
    b: &mut [S::Elem],
) {
    let c = Sgd::of(s, rnd);
    let wd = s.weight_decay != 0.0;
    let mom = match (s.momentum != 0.0, s.first_step) {
        (false, _) => 0,
        (true, true) => 1,
        (true, false) => 2,
    };
    macro_rules! go {
        ($wd:literal, $mom:literal, $nest:literal) => {
            sgd_block::<$wd, $mom, $nest, S>(c, rnd, p, g, b)
        };
    }
    match (wd, mom, s.nesterov && mom != 0) {
        (false, 0, _) => go!(false, 0, false),
        (true, 0, _) => go!(true, 0, false),
        (false, 1, false) => go!(false, 1, false),
        (false, 1, true) => go!(false, 1, true),
        (true, 1, false) => go!(true, 1, false),
        (true, 1, true) => go!(true, 1, true),
        (false, _, false) => go!(false, 2, false),
        (false, _, true) => go!(false, 2, true),
        (true, _, false) => go!(true, 2, false),
        (true, _, true) => go!(true, 2, true),
    }
}

/// `torch.optim.SGD`'s step over every rank and parameter of host arenas: the fused,
/// multi-threaded twin of [`kernels::sgd_reference`] (bit for bit the same results).
pub(crate) fn sgd(
    threads: usize,
    params: &mut Arena,
    grads: &Arena,
    momentum: Option<&mut Arena>,
    starts: &ParamStarts,
    scalars: &[SgdScalars],
) -> Result<()> {
    let format = params.format();
    let aligned = plan(
        params.ranks(),
        params.rank_len(),
        starts,
        |e| scalars.get(e).is_some_and(|s| s.active),
        threads,
    );
    let plan = match aligned {
        Some(plan)
            if format != StorageFormat::F64
                && kernels::check_sgd_arenas(
                    params,
                    grads,
                    momentum.as_deref(),
                    starts,
                    scalars,
                )
                .is_ok() =>
        {
            plan
        }
        _ => return kernels::sgd_reference(params, grads, momentum, starts, scalars),
    };
    let g = split_words_ref(host_words(grads)?, format, &plan.bounds);
    let b = split_optional(
        momentum.map(host_words_mut).transpose()?,
        format,
        &plan.bounds,
    );
    let p = split_words(host_words_mut(params)?, format, &plan.bounds);
    let work: Vec<_> = plan
        .parts
        .into_iter()
        .zip(p)
        .zip(g)
        .zip(b)
        .map(|(((segments, p), g), b)| (segments, p, g, b))
        .collect();
    run_parts(work, |(segments, p, g, b)| {
        run_best(SgdPart {
            format,
            scalars,
            segments,
            p,
            g,
            b,
        })
    });
    Ok(())
}

/// One part of an SGD step.
struct SgdPart<'a> {
    format: StorageFormat,
    scalars: &'a [SgdScalars],
    segments: Vec<Segment>,
    p: &'a mut [u32],
    g: &'a [u32],
    b: Option<&'a mut [u32]>,
}

impl PartWork for SgdPart<'_> {
    #[inline(always)]
    fn run(mut self) {
        for seg in &self.segments {
            let s = &self.scalars[seg.entry];
            let mut empty: [u32; 0] = [];
            let b: &mut [u32] = match (&mut self.b, s.momentum != 0.0) {
                (Some(b), true) => b,
                _ => &mut empty,
            };
            sgd_segment(self.format, s, seg, self.p, self.g, b);
        }
    }
}

#[inline(always)]
fn sgd_segment(
    format: StorageFormat,
    s: &SgdScalars,
    seg: &Segment,
    p: &mut [u32],
    g: &[u32],
    b: &mut [u32],
) {
    #[inline(always)]
    fn go<S: Storage>(
        st: S,
        s: &SgdScalars,
        seg: &Segment,
        p: &mut [u32],
        g: &[u32],
        b: &mut [u32],
    ) {
        sgd_dispatch(s, st, rows_mut(p, seg), rows(g, seg), rows_mut(b, seg));
    }
    use std::marker::PhantomData as M;
    match (format, s.fused) {
        (StorageFormat::F32, false) => go(Exact, s, seg, p, g, b),
        (StorageFormat::F32, true) => go(ExactFused, s, seg, p, g, b),
        (StorageFormat::F16, false) => go(To::<Binary16>(M), s, seg, p, g, b),
        (StorageFormat::BF16, false) => go(To::<BFloat16>(M), s, seg, p, g, b),
        (StorageFormat::F16, true) => go(Opmath::<Binary16>(M), s, seg, p, g, b),
        (StorageFormat::BF16, true) => go(Opmath::<BFloat16>(M), s, seg, p, g, b),
        (StorageFormat::F64, _) => unreachable!("float64 runs the reference"),
    }
}

// ---------------------------------------------------------------------------------------------
// Adam / AdamW.

/// One (rank, parameter)'s Adam constants in float32.
#[derive(Clone, Copy)]
struct Adam {
    flip: u32,
    w: f32,
    one_minus_w: f32,
    w_minus_one: f32,
    wd: f32,
    decay: f32,
    beta2: f32,
    one_minus_beta2: f32,
    neg_step: f32,
    bc2: f32,
    eps: f32,
}

impl Adam {
    /// The constants as the kernel uses them (`add(alpha=)`'s scalar and `eps`, which PyTorch
    /// makes a tensor of the parameter's dtype, rounded to the storage format).
    fn of<S: Storage>(s: &AdamScalars, rnd: S) -> Adam {
        let w = s.one_minus_beta1 as f32;
        Adam {
            flip: if s.maximize { 0x8000_0000 } else { 0 },
            w,
            one_minus_w: 1.0 - w,
            w_minus_one: w - 1.0,
            wd: rnd.r(s.weight_decay as f32),
            decay: s.decay_factor as f32,
            beta2: s.beta2 as f32,
            one_minus_beta2: s.one_minus_beta2 as f32,
            neg_step: -s.step_size as f32,
            bc2: s.bias_correction2_sqrt as f32,
            eps: rnd.r(s.eps as f32),
        }
    }
}

/// The Adam update of `adam_rank` in [`super::kernels`], element by element. `DECAY`: 0 none,
/// 1 L2 (Adam's weight decay), 2 decoupled (AdamW). `UPPER`: `1 - beta1 >= 0.5` (PyTorch's lerp
/// takes its other formula).
#[inline(always)]
fn adam_block<const DECAY: u8, const UPPER: bool, const AMSGRAD: bool, S: Storage>(
    c: Adam,
    st: S,
    a: AdamRows<'_, S::Elem>,
) {
    let r = |x| st.r(x);
    let n = a.p.len();
    let (g, m, v) = (&a.g[..n], &mut a.m[..n], &mut a.v[..n]);
    let vmax: &mut [S::Elem] = if AMSGRAD { &mut a.vmax[..n] } else { &mut [] };
    for i in 0..n {
        let mut param = st.load(a.p[i]);
        let mut grad = signed(st.load(g[i]), c.flip);
        if DECAY == 2 {
            param = r(param * c.decay);
        } else if DECAY == 1 {
            grad = if S::FUSED {
                param.mul_add(c.wd, grad)
            } else {
                add_scaled(st, grad, c.wd, param)
            };
        }
        let m_old = st.load(m[i]);
        let diff = grad - m_old;
        let m_new = match (UPPER, S::FUSED) {
            (true, false) => r(grad - diff * c.one_minus_w),
            (false, false) => r(m_old + c.w * diff),
            (true, true) => c.w_minus_one.mul_add(diff, grad),
            (false, true) => c.w.mul_add(diff, m_old),
        };
        m[i] = st.store(m_new);
        let v_scaled = r(st.load(v[i]) * c.beta2);
        let v_new = if S::FUSED {
            (c.one_minus_beta2 * grad).mul_add(grad, v_scaled)
        } else {
            r(v_scaled + (c.one_minus_beta2 * grad) * grad)
        };
        v[i] = st.store(v_new);
        let second = if AMSGRAD {
            let old = st.load(vmax[i]);
            // torch.maximum propagates NaN.
            let new = if v_new.is_nan() || old.is_nan() {
                if v_new.is_nan() { v_new } else { old }
            } else if v_new > old {
                v_new
            } else {
                old
            };
            vmax[i] = st.store(new);
            new
        } else {
            v_new
        };
        // `(sqrt / bc2).add_(eps)`, then `param.addcdiv_(exp_avg, denom, value=-step_size)`
        // left to right, rounded once.
        let denom = r(r(r(second.sqrt()) / c.bc2) + c.eps);
        a.p[i] = st.store(r(param + c.neg_step * m_new / denom));
    }
}

/// The rows of one Adam segment, as float32.
struct AdamRows<'a, E> {
    p: &'a mut [E],
    g: &'a [E],
    m: &'a mut [E],
    v: &'a mut [E],
    vmax: &'a mut [E],
}

#[inline(always)]
fn adam_dispatch<S: Storage>(s: &AdamScalars, rnd: S, rows: AdamRows<'_, S::Elem>) {
    let c = Adam::of(s, rnd);
    let decay = if s.decoupled {
        2
    } else if s.weight_decay != 0.0 {
        1
    } else {
        0
    };
    let upper = c.w >= 0.5;
    macro_rules! go {
        ($d:literal, $u:literal, $a:literal) => {
            adam_block::<$d, $u, $a, S>(c, rnd, rows)
        };
    }
    match (decay, upper, s.amsgrad) {
        (0, false, false) => go!(0, false, false),
        (0, false, true) => go!(0, false, true),
        (0, true, false) => go!(0, true, false),
        (0, true, true) => go!(0, true, true),
        (1, false, false) => go!(1, false, false),
        (1, false, true) => go!(1, false, true),
        (1, true, false) => go!(1, true, false),
        (1, true, true) => go!(1, true, true),
        (_, false, false) => go!(2, false, false),
        (_, false, true) => go!(2, false, true),
        (_, true, false) => go!(2, true, false),
        (_, true, true) => go!(2, true, true),
    }
}

/// `torch.optim.Adam`/`AdamW`'s step over every rank and parameter of host arenas: the fused,
/// multi-threaded twin of [`kernels::adam_reference`] (bit for bit the same results).
pub(crate) fn adam(
    threads: usize,
    arenas: AdamArenas<'_>,
    starts: &ParamStarts,
    scalars: &[AdamScalars],
) -> Result<()> {
    let format = arenas.params.format();
    let planned = plan(
        arenas.params.ranks(),
        arenas.params.rank_len(),
        starts,
        |e| scalars.get(e).is_some_and(|s| s.active),
        threads,
    );
    let plan = match planned {
        Some(plan)
            if format != StorageFormat::F64
                && kernels::check_adam_arenas(&arenas, starts, scalars).is_ok() =>
        {
            plan
        }
        _ => return kernels::adam_reference(arenas, starts, scalars),
    };
    let AdamArenas {
        params,
        grads,
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
    } = arenas;
    let bounds = &plan.bounds;
    let g = split_words_ref(host_words(grads)?, format, bounds);
    let m = split_words(host_words_mut(exp_avg)?, format, bounds);
    let v = split_words(host_words_mut(exp_avg_sq)?, format, bounds);
    let x = split_optional(
        max_exp_avg_sq.map(host_words_mut).transpose()?,
        format,
        bounds,
    );
    let p = split_words(host_words_mut(params)?, format, bounds);
    let work: Vec<_> = plan
        .parts
        .into_iter()
        .zip(p)
        .zip(g)
        .zip(m)
        .zip(v)
        .zip(x)
        .map(|(((((segments, p), g), m), v), x)| (segments, p, g, m, v, x))
        .collect();
    run_parts(work, |(segments, p, g, m, v, x)| {
        run_best(AdamPart {
            format,
            scalars,
            segments,
            arrays: [p, m, v],
            g,
            x,
        })
    });
    Ok(())
}

/// One part of an Adam step: parameters, first and second moments, gradients, maxima.
struct AdamPart<'a> {
    format: StorageFormat,
    scalars: &'a [AdamScalars],
    segments: Vec<Segment>,
    arrays: [&'a mut [u32]; 3],
    g: &'a [u32],
    x: Option<&'a mut [u32]>,
}

impl PartWork for AdamPart<'_> {
    #[inline(always)]
    fn run(mut self) {
        let [p, m, v] = self.arrays;
        for seg in &self.segments {
            let s = &self.scalars[seg.entry];
            let mut empty: [u32; 0] = [];
            let x: &mut [u32] = match (&mut self.x, s.amsgrad) {
                (Some(x), true) => x,
                _ => &mut empty,
            };
            adam_segment(self.format, s, seg, [&mut *p, &mut *m, &mut *v, x], self.g);
        }
    }
}

#[inline(always)]
fn adam_segment(
    format: StorageFormat,
    s: &AdamScalars,
    seg: &Segment,
    arrays: [&mut [u32]; 4],
    g: &[u32],
) {
    #[inline(always)]
    fn go<S: Storage>(
        st: S,
        s: &AdamScalars,
        seg: &Segment,
        [p, m, v, x]: [&mut [u32]; 4],
        g: &[u32],
    ) {
        let rows = AdamRows {
            p: rows_mut(p, seg),
            g: rows(g, seg),
            m: rows_mut(m, seg),
            v: rows_mut(v, seg),
            vmax: rows_mut(x, seg),
        };
        adam_dispatch(s, st, rows);
    }
    use std::marker::PhantomData as M;
    match (format, s.fused) {
        (StorageFormat::F32, false) => go(Exact, s, seg, arrays, g),
        (StorageFormat::F32, true) => go(ExactFused, s, seg, arrays, g),
        (StorageFormat::F16, false) => go(To::<Binary16>(M), s, seg, arrays, g),
        (StorageFormat::BF16, false) => go(To::<BFloat16>(M), s, seg, arrays, g),
        (StorageFormat::F16, true) => go(Opmath::<Binary16>(M), s, seg, arrays, g),
        (StorageFormat::BF16, true) => go(Opmath::<BFloat16>(M), s, seg, arrays, g),
        (StorageFormat::F64, _) => unreachable!("float64 runs the reference"),
    }
}

// ---------------------------------------------------------------------------------------------
// Averaging.

/// [`kernels::average_reference`], split across threads along the element axis (every group's
/// ranks of one element range per part), for float32 arenas averaged in float32; the other
/// formats run the reference.
pub(crate) fn average(
    threads: usize,
    arena: &mut Arena,
    group_size: usize,
    arith: StorageFormat,
    starts: &ParamStarts,
    active: &[bool],
) -> Result<()> {
    let (ranks, len) = (arena.ranks(), arena.rank_len());
    let usable = arena.format() == StorageFormat::F32
        && arith == StorageFormat::F32
        && group_size > 0
        && ranks.is_multiple_of(group_size)
        && active.len() == starts.0.len();
    // Split one rank's element axis; every part then covers all ranks.
    let planned = plan(
        1,
        len,
        starts,
        |j| active.get(j).copied().unwrap_or(false),
        threads,
    );
    let plan = match planned {
        Some(plan) if usable => plan,
        _ => return kernels::average_reference(arena, group_size, arith, starts, active),
    };
    let words = host_words_mut(arena)?;
    let values: &mut [f32] = bytemuck::cast_slice_mut(words);
    // Per part, every rank's slice of the part's element range.
    let mut per_part: Vec<Vec<&mut [f32]>> = plan.parts.iter().map(|_| Vec::new()).collect();
    for rank in values.chunks_mut(len.max(1)).take(ranks) {
        let mut rest = rank;
        let mut at = 0;
        for (k, slot) in per_part.iter_mut().enumerate() {
            let (head, tail) = rest.split_at_mut(plan.bounds[k + 1] - at);
            at = plan.bounds[k + 1];
            slot.push(head);
            rest = tail;
        }
    }
    let work: Vec<_> = plan.parts.into_iter().zip(per_part).collect();
    let quotient = Quotient::by(group_size as f32);
    run_parts(work, |(segments, rows)| match quotient {
        Quotient::Divide(d) => run_best(AveragePart {
            segments,
            rows,
            group_size,
            quotient: ByDivision(d),
        }),
        Quotient::Scale(s) => run_best(AveragePart {
            segments,
            rows,
            group_size,
            quotient: ByScale(s),
        }),
    });
    Ok(())
}

/// Elements of every row summed before the mean is written back.
const AVERAGE_BLOCK: usize = 1024;

/// One part of an averaging step: every rank's slice of the part's element range.
struct AveragePart<'a, Q> {
    segments: Vec<Segment>,
    rows: Vec<&'a mut [f32]>,
    group_size: usize,
    /// Division by the group size (a product when that is exact).
    quotient: Q,
}

impl<Q: Divide> PartWork for AveragePart<'_, Q> {
    #[inline(always)]
    fn run(mut self) {
        let mut acc = [0f32; AVERAGE_BLOCK];
        for seg in &self.segments {
            let mut first = seg.first;
            let end = seg.first + seg.len;
            while first < end {
                let n = AVERAGE_BLOCK.min(end - first);
                for group in self.rows.chunks_mut(self.group_size) {
                    let acc = &mut acc[..n];
                    for (a, &x) in acc.iter_mut().zip(&group[0][first..first + n]) {
                        *a = self.quotient.of(x);
                    }
                    for row in &group[1..] {
                        for (a, &x) in acc.iter_mut().zip(&row[first..first + n]) {
                            *a += self.quotient.of(x);
                        }
                    }
                    for row in group.iter_mut() {
                        row[first..first + n].copy_from_slice(acc);
                    }
                }
                first += n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{ArenaStorage, layout_params};

    /// A deterministic stream of values with zeros of both signs, subnormals, huge values,
    /// infinities and NaNs among ordinary ones.
    struct Values(u64);

    impl Values {
        fn next_u32(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) as u32
        }

        fn value(&mut self) -> f32 {
            let r = self.next_u32();
            match r % 40 {
                0 => 0.0,
                1 => -0.0,
                2 => f32::from_bits(r >> 9),
                3 => f32::INFINITY,
                4 => f32::NAN,
                5 => 70000.0,
                6 => 1e-6,
                _ => (r % 20_000) as f32 / 10_000.0 - 1.0,
            }
        }
    }

    fn arena(format: StorageFormat, ranks: usize, rank_len: usize, v: &mut Values) -> Arena {
        let words = format.words_for(rank_len) * ranks;
        let mut data = vec![0u32; words];
        let n = ranks * rank_len;
        for i in 0..n {
            let x = v.value();
            if format == StorageFormat::F64 {
                format.store_f64(&mut data, i, f64::from(x));
            } else {
                format.store(&mut data, i, x);
            }
            // Now and then a 16-bit NaN with a payload, quiet or signaling, which no store
            // writes (stores write the canonical NaN).
            if i % 97 == 5 {
                let nan = match format {
                    StorageFormat::F16 => [0x7c01u32, 0xfe05][i % 2],
                    StorageFormat::BF16 => [0x7f81u32, 0xffc5][i % 2],
                    _ => continue,
                };
                let shift = 16 * (i % 2) as u32;
                data[i / 2] = (data[i / 2] & !(0xffff << shift)) | (nan << shift);
            }
        }
        Arena::new(
            format,
            ranks,
            rank_len,
            rank_len,
            ArenaStorage::Host(data.into()),
        )
    }

    fn copy(a: &Arena) -> Arena {
        let words = host_words(a).unwrap().to_vec();
        Arena::new(
            a.format(),
            a.ranks(),
            a.rank_len(),
            a.rank_len(),
            ArenaStorage::Host(words.into()),
        )
    }

    /// Bit for bit, except that a NaN matches any NaN (payload and sign are not specified).
    fn same(a: &Arena, b: &Arena, what: &str) {
        let format = a.format();
        let n = a.ranks() * a.rank_len();
        let words = (host_words(a).unwrap(), host_words(b).unwrap());
        for i in 0..n {
            let (x, y) = if format == StorageFormat::F64 {
                (format.load_f64(words.0, i), format.load_f64(words.1, i))
            } else {
                let (x, y) = (format.load(words.0, i), format.load(words.1, i));
                (f64::from(x), f64::from(y))
            };
            let ok = (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits();
            assert!(ok, "{what}: element {i}: {x:e} != reference {y:e}");
        }
    }

    /// Parameter sizes with tiny ones, slot-sized and odd ones, and one big enough to be split
    /// between threads.
    const SIZES: [usize; 8] = [1, 63, 64, 65, 7, 3000, 2, 70_001];
    const FORMATS: [StorageFormat; 4] = [
        StorageFormat::F32,
        StorageFormat::F16,
        StorageFormat::BF16,
        StorageFormat::F64,
    ];

    #[test]
    fn plans_cover_every_active_element_once_at_slot_boundaries() {
        let (offsets, rank_len) = layout_params(&SIZES);
        let starts = ParamStarts(offsets.iter().map(|&o| o as u32).collect());
        for threads in [1, 2, 3, 8] {
            for ranks in [1, 3] {
                let active = |e: usize| e % 3 != 1;
                let plan = plan(ranks, rank_len, &starts, active, threads).unwrap();
                assert!(plan.parts.len() <= threads);
                assert_eq!(plan.bounds.len(), plan.parts.len() + 1);
                let mut seen = vec![0u8; ranks * rank_len];
                for (k, part) in plan.parts.iter().enumerate() {
                    assert_eq!(plan.bounds[k] % PARAM_ALIGN_ELEMENTS, 0);
                    for seg in part {
                        let first = plan.bounds[k] + seg.first;
                        assert!(first + seg.len <= plan.bounds[k + 1]);
                        for x in &mut seen[first..first + seg.len] {
                            *x += 1;
                        }
                    }
                }
                for rank in 0..ranks {
                    for (j, &n) in SIZES.iter().enumerate() {
                        let want = u8::from(active(rank * SIZES.len() + j));
                        let at = rank * rank_len + offsets[j];
                        assert!(seen[at..at + n].iter().all(|&x| x == want));
                    }
                }
            }
        }
    }

    #[test]
    fn sgd_matches_the_reference_bit_for_bit() {
        let (offsets, rank_len) = layout_params(&SIZES);
        let starts = ParamStarts(offsets.iter().map(|&o| o as u32).collect());
        let ranks = 3;
        let mut v = Values(7);
        for format in FORMATS {
            for variant in 0..32u32 {
                if variant & 16 == 16 && format == StorageFormat::F64 {
                    continue; // float64 runs the reference, fused or not
                }
                let scalars: Vec<SgdScalars> = (0..ranks * SIZES.len())
                    .map(|e| SgdScalars {
                        active: !(e as u32 + variant).is_multiple_of(5),
                        first_step: variant & 1 == 1,
                        nesterov: variant & 2 == 2 && e % 2 == 0,
                        maximize: e % 3 == 0,
                        lr: 0.1,
                        momentum: if variant & 4 == 4 { 0.0 } else { 0.9 },
                        one_minus_dampening: if e % 2 == 0 { 1.0 } else { 0.7 },
                        weight_decay: if variant & 8 == 8 || e % 4 == 1 {
                            0.01
                        } else {
                            0.0
                        },
                        fused: variant & 16 == 16,
                    })
                    .collect();
                let (p, g, b) = (
                    arena(format, ranks, rank_len, &mut v),
                    arena(format, ranks, rank_len, &mut v),
                    arena(format, ranks, rank_len, &mut v),
                );
                let (mut p0, mut b0) = (copy(&p), copy(&b));
                kernels::sgd_reference(&mut p0, &g, Some(&mut b0), &starts, &scalars).unwrap();
                for threads in [1, 2, 3] {
                    let (mut p1, mut b1) = (copy(&p), copy(&b));
                    sgd(threads, &mut p1, &g, Some(&mut b1), &starts, &scalars).unwrap();
                    let what = format!("sgd {format:?} variant {variant} threads {threads}");
                    same(&p1, &p0, &format!("{what}: params"));
                    same(&b1, &b0, &format!("{what}: momentum"));
                }
            }
        }
    }

    #[test]
    fn adam_matches_the_reference_bit_for_bit() {
        let (offsets, rank_len) = layout_params(&SIZES);
        let starts = ParamStarts(offsets.iter().map(|&o| o as u32).collect());
        let ranks = 2;
        let mut v = Values(11);
        for format in FORMATS {
            for variant in 0..16u32 {
                if variant & 8 == 8 && format == StorageFormat::F64 {
                    continue; // float64 runs the reference, fused or not
                }
                let scalars: Vec<AdamScalars> = (0..ranks * SIZES.len())
                    .map(|e| {
                        let beta1 = if e % 2 == 0 { 0.9 } else { 0.3 };
                        AdamScalars {
                            active: !(e as u32 + variant).is_multiple_of(4),
                            maximize: e % 3 == 0,
                            amsgrad: variant & 1 == 1,
                            decoupled: variant & 2 == 2,
                            weight_decay: if variant & 4 == 4 { 0.01 } else { 0.0 },
                            decay_factor: 1.0 - 1e-3 * 0.01,
                            one_minus_beta1: 1.0 - beta1,
                            beta2: 0.999,
                            one_minus_beta2: 1.0 - 0.999,
                            step_size: 1e-3 / (1.0 - beta1 * beta1),
                            bias_correction2_sqrt: (1.0f64 - 0.999 * 0.999).sqrt(),
                            eps: 1e-8,
                            fused: variant & 8 == 8,
                        }
                    })
                    .collect();
                let mut a: Vec<Arena> = (0..5)
                    .map(|_| arena(format, ranks, rank_len, &mut v))
                    .collect();
                // Second moments are never negative.
                for k in [3, 4] {
                    let words = match &mut a[k].storage {
                        ArenaStorage::Host(w) => w,
                        _ => unreachable!(),
                    };
                    let n = ranks * rank_len;
                    for i in 0..n {
                        let x = if format == StorageFormat::F64 {
                            format.load_f64(words, i).abs()
                        } else {
                            f64::from(format.load(words, i).abs())
                        };
                        if format == StorageFormat::F64 {
                            format.store_f64(words, i, x);
                        } else {
                            format.store(words, i, x as f32);
                        }
                    }
                }
                let run = |threads: Option<usize>| {
                    let mut c: Vec<Arena> = a.iter().map(copy).collect();
                    let [p, g, m, s, x] = &mut c[..] else {
                        unreachable!()
                    };
                    let arenas = AdamArenas {
                        params: p,
                        grads: g,
                        exp_avg: m,
                        exp_avg_sq: s,
                        max_exp_avg_sq: Some(x),
                    };
                    match threads {
                        None => kernels::adam_reference(arenas, &starts, &scalars).unwrap(),
                        Some(t) => adam(t, arenas, &starts, &scalars).unwrap(),
                    }
                    c
                };
                let want = run(None);
                for threads in [1, 2, 3] {
                    let got = run(Some(threads));
                    for (k, name) in ["params", "grads", "exp_avg", "exp_avg_sq", "max"]
                        .iter()
                        .enumerate()
                    {
                        let what = format!("adam {format:?} variant {variant} threads {threads}");
                        same(&got[k], &want[k], &format!("{what}: {name}"));
                    }
                }
            }
        }
    }

    #[test]
    fn average_matches_the_reference_bit_for_bit() {
        let (offsets, rank_len) = layout_params(&SIZES);
        let starts = ParamStarts(offsets.iter().map(|&o| o as u32).collect());
        let mut v = Values(3);
        for (ranks, group) in [(4, 2), (6, 3), (8, 8), (3, 1)] {
            let a = arena(StorageFormat::F32, ranks, rank_len, &mut v);
            let active: Vec<bool> = (0..SIZES.len()).map(|j| j % 3 != 2).collect();
            let mut want = copy(&a);
            kernels::average_reference(&mut want, group, StorageFormat::F32, &starts, &active)
                .unwrap();
            for threads in [1, 2, 5] {
                let mut got = copy(&a);
                average(
                    threads,
                    &mut got,
                    group,
                    StorageFormat::F32,
                    &starts,
                    &active,
                )
                .unwrap();
                same(
                    &got,
                    &want,
                    &format!("average R={ranks} g={group} threads {threads}"),
                );
            }
        }
    }
}
