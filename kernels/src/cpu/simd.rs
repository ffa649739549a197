//! AVX-512 forms of the loops that the portable x86-64 baseline this crate is compiled for
//! leaves scalar or half-width: copying and adding short image rows (im2col, col2im: rows of 7
//! to 30 floats, one masked 16-lane operation each instead of a 4-lane loop and a scalar tail),
//! 2x2 max pooling (16 windows per step instead of one) and batch norm backward's per-map sums
//! (the compiler kept their sixteen `f64` partial sums on the stack, half of them scalar).
//! Chosen at run time with [`Vectors::detect`]; other machines take the portable loops (compiled
//! for AVX2 where the CPU has it). Both give bit-identical results: the same operations on the
//! same values in the same order, only several lanes at once.

/// Output channels per register tile of the direct convolution ([`Avx512::shifted_conv`]):
/// a convolution runs there only with a multiple of this many.
pub(crate) const CONV_OB: usize = 4;

/// Memory that the next piece of work will read or write, brought into the core's L2 cache a
/// few lines at a time while a direct kernel computes the current piece ([`Lines`]).
///
/// In a training step the next image's input and output are cold: ResNet-20's step at batch 128
/// moves several hundred MB of activations, far past the caches, and the copies that touched
/// them first (`pad_image`, the output's zeroing) waited on memory: 14% and 8% of a two-thread
/// step in perf, against 9% and 3% with these hints. Regions are plain addresses: a prefetch is
/// a hint that never faults and reads nothing the program can observe, so any region is sound,
/// also one past a slice's end.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ahead {
    /// `(first line's address, bytes from it)`, walked in order; unused ones empty.
    regions: [(usize, usize); 3],
}

impl Ahead {
    /// Up to three `(start, floats)` regions, by address alone.
    ///
    /// # Panics
    /// With more than three regions.
    pub(crate) fn at(regions: &[(*const f32, usize)]) -> Ahead {
        assert!(regions.len() <= 3, "Ahead: at most 3 regions");
        let mut ahead = Ahead::default();
        for (slot, &(p, n)) in ahead.regions.iter_mut().zip(regions) {
            let (addr, line) = (p as usize, p as usize & !63);
            *slot = (line, n.saturating_mul(4).saturating_add(addr - line));
        }
        ahead
    }
}

/// Walks an [`Ahead`]'s cache lines, an equal share per [`Lines::step`]: a kernel that steps
/// once per input channel of each register tile spreads them over its run (all at once, per
/// tile, they queued behind each other for the core's few line-fill buffers and stalled it).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Lines {
    regions: [(usize, usize); 3],
    /// Region and byte offset of the next line.
    region: usize,
    at: usize,
    per_step: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl Lines {
    /// For a kernel of `steps` steps.
    pub(crate) fn new(ahead: Ahead, steps: usize) -> Lines {
        let lines: usize = ahead.regions.iter().map(|&(_, b)| b.div_ceil(64)).sum();
        Lines {
            regions: ahead.regions,
            region: 0,
            at: 0,
            per_step: lines.div_ceil(steps.max(1)),
        }
    }

    /// `f(address)` for each of the next step's lines (none once all were walked).
    #[inline(always)]
    pub(crate) fn step(&mut self, mut f: impl FnMut(usize)) {
        let mut left = self.per_step;
        while left > 0 && self.region < self.regions.len() {
            let (start, bytes) = self.regions[self.region];
            if self.at >= bytes {
                self.region += 1;
                self.at = 0;
                continue;
            }
            f(start.wrapping_add(self.at));
            self.at += 64;
            left -= 1;
        }
    }
}

#[cfg(test)]
#[test]
fn lines_walk_every_line_of_each_region_once_within_the_steps() {
    let (a, b) = (vec![0.0f32; 100], vec![0.0f32; 37]);
    // `b` from its third float: a start that need not be on a line's boundary.
    let regions = [(a.as_ptr(), 100), (b[3..].as_ptr(), 34)];
    let mut lines = Lines::new(Ahead::at(&regions), 4);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let before = seen.len();
        lines.step(|l| seen.push(l));
        assert!(seen.len() - before <= lines.per_step);
    }
    lines.step(|_| panic!("a line past the last step"));
    let expected: Vec<usize> = regions
        .iter()
        .flat_map(|&(p, n)| {
            let (lo, hi) = (p as usize & !63, p as usize + 4 * n);
            (lo..hi).step_by(64)
        })
        .collect();
    assert_eq!(seen, expected);
}

/// One direct convolution over an input laid out so that each kernel tap is a constant shift
/// (`conv.rs`' padded row pitch): `out[o * pitch + j] = bias[o] + sum_c sum_t w[o, c, t] *
/// input[c * plane + shifts[t] + j]` for `o < out_channels`, `j < n`.
pub(crate) struct ShiftedConv<'a> {
    /// `channels` planes of `plane` floats.
    pub input: &'a [f32],
    pub channels: usize,
    pub plane: usize,
    /// Each tap's offset in a plane.
    pub shifts: &'a [usize],
    /// The weights as `[out_channels / 4][channels][taps][4]`.
    pub packed: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub out_channels: usize,
    /// Output pixels per row, and the row pitch (at least `n`).
    pub n: usize,
    pub pitch: usize,
    /// Brought into cache while it runs.
    pub ahead: Ahead,
}

/// One direct weight gradient over an input laid out so that each kernel tap is a constant
/// shift (`conv.rs`' padded row pitch), the transpose of [`ShiftedConv`]:
/// `grad[(c * taps + t) * out_channels + o] += sum_j dy[o * dy_pitch + j] * input[c * plane +
/// shifts[t] + j]` for `j < n`, the output gradient laid out in the input's row pitch (zeros
/// where its rows hold no pixel), with no unfolded copy of the input.
pub(crate) struct ShiftedWeightGrad<'a> {
    /// `channels` planes of `plane` floats.
    pub input: &'a [f32],
    pub channels: usize,
    pub plane: usize,
    /// Each tap's offset in a plane.
    pub shifts: &'a [usize],
    /// `out_channels` rows of `n` floats, `dy_pitch` floats apart.
    pub dy: &'a [f32],
    pub dy_pitch: usize,
    pub out_channels: usize,
    pub n: usize,
}

/// One direct convolution with the output channels in the vector lanes (where
/// [`ShiftedConv`]'s pixel lanes would be mostly padding: rows of 7 or 14 pixels), over an
/// input laid out so that each kernel tap is a constant shift (`conv.rs`' padded planes):
/// `out[(r * width + w) * out_channels + o] = bias[o] + sum_c sum_t w[o, c, t] * input[c *
/// plane + shifts[t] + r * row_pitch + w]` for `r < rows`, `w < width`, `o < out_channels`.
/// The output is pixel-major (`[rows * width][out_channels]`). Each sum runs over the channels
/// in blocks of `block_channels`, each block from zero and then added on (as a GEMM's `k`
/// blocks), so that no single running sum is longer than a block.
pub(crate) struct LaneConv<'a> {
    /// `channels` planes of `plane` floats.
    pub input: &'a [f32],
    pub channels: usize,
    pub plane: usize,
    /// Each tap's offset in a plane.
    pub shifts: &'a [usize],
    /// The input's row pitch, and the output's rows and pixels per row.
    pub row_pitch: usize,
    pub rows: usize,
    pub width: usize,
    /// The weights as `[out_channels / (16 * v)][channels][taps][16 * v]`, `v` being
    /// [`lane_vectors`].
    pub packed: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub out_channels: usize,
    pub block_channels: usize,
    /// Brought into cache while it runs.
    pub ahead: Ahead,
}

/// One 3x3 weight gradient with the output channels in the vector lanes, the transpose of
/// [`LaneConv`]: `grad[(c * 9 + t) * out_channels + o] += sum_r sum_w dy[(r * width + w) *
/// out_channels + o] * input[c * plane + (r + t / 3) * row_pitch + w + t % 3]` over the
/// output's `rows x width` pixels, `dy` pixel-major. Each of the image's sums runs over its
/// pixels in order, from zero, and is then added to `grad`.
pub(crate) struct LaneWeightGrad<'a> {
    /// `channels` planes of `plane` floats, rows `row_pitch` apart.
    pub input: &'a [f32],
    pub channels: usize,
    pub plane: usize,
    pub row_pitch: usize,
    pub rows: usize,
    pub width: usize,
    /// `[rows * width][out_channels]`.
    pub dy: &'a [f32],
    pub out_channels: usize,
}

/// The widest output row [`LaneConv`] takes: one register tile of 2 vectors of output channels
/// x 14 pixels (28 accumulators of the 32 registers), or 4 x 7.
pub(crate) const LANE_MAX_WIDTH: usize = 14;

/// Output-channel vectors per register tile of [`LaneConv`] for `out_channels` (a multiple of
/// 32) on rows of `width` pixels: 4 where 64 channels divide it and the row has at most 7
/// pixels, else 2.
pub(crate) fn lane_vectors(out_channels: usize, width: usize) -> usize {
    if out_channels % 64 == 0 && width <= 7 {
        4
    } else {
        2
    }
}

/// The widest vector instructions this CPU runs that `EMBER_SIMD` allows: AVX-512F, else AVX2
/// and FMA, else the x86-64 baseline. Every dispatch between the three ([`wide`], `conv.rs`'
/// row loops, batch norm's sums) takes them in this one order.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Vectors {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512(Avx512),
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2(Avx2),
    Portable,
}

impl Vectors {
    pub(crate) fn detect() -> Vectors {
        if let Some(cpu) = Avx512::detect() {
            Vectors::Avx512(cpu)
        } else if let Some(cpu) = Avx2::detect() {
            Vectors::Avx2(cpu)
        } else {
            Vectors::Portable
        }
    }

    /// `avx512f`, `avx2` or `portable`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Vectors::Avx512(_) => "avx512f",
            Vectors::Avx2(_) => "avx2",
            Vectors::Portable => "portable",
        }
    }
}

/// Runs `f` inside a function compiled for the [`Vectors`] this CPU has: AVX-512F, or AVX2 and
/// FMA, else as it is. Given
/// an `#[inline(always)]` closure, its loops are vectorised there 8 `f64`s or 16 `f32`s wide
/// instead of the x86-64 baseline's 2 or 4 (batch norm's `f64` passes ran on SSE2's two lanes:
/// 7% of a ResNet-20 step). The same operations in the same order either way (the compiler
/// neither contracts them into FMAs nor reassociates them), so the results are bit-identical.
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    match Vectors::detect() {
        #[cfg(target_arch = "x86_64")]
        Vectors::Avx512(_) => {
            #[target_feature(enable = "avx512f")]
            fn run<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: calling a function compiled for AVX-512F needs a CPU that runs it, which
            // the token's `Avx512::detect` checked.
            unsafe { run(f) }
        }
        #[cfg(target_arch = "x86_64")]
        Vectors::Avx2(_) => {
            #[target_feature(enable = "avx2,fma")]
            fn run<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: calling a function compiled for AVX2 and FMA needs a CPU that runs them,
            // which the token's `Avx2::detect` checked.
            unsafe { run(f) }
        }
        _ => f(),
    }
}

/// Proof that this CPU runs AVX2 and FMA, as [`Avx512`] is for AVX-512F: only
/// [`Avx2::detect`] makes one. The machines without AVX-512 that ember meets (Zen 2 and 3,
/// most desktop Intel parts) have them; the portable loops, compiled for the x86-64 baseline,
/// run there on SSE2's 4 `f32` or 2 `f64` lanes. Inside a function compiled for AVX2 ([`wide`],
/// `conv.rs`' row dispatch) the same loops run 8 or 4 lanes wide: the same operations in the
/// same order (no FMA contraction, no reassociation), so the same bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2 {
    _proof: (),
}

impl Avx2 {
    /// A token when the CPU runs AVX2 and FMA and `EMBER_SIMD` does not ask for the portable
    /// loops (also on an AVX-512 CPU: callers try [`Avx512::detect`] first).
    pub(crate) fn detect() -> Option<Self> {
        if crate::simd_setting() == crate::Simd::Portable {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Some(Self { _proof: () });
        }
        None
    }
}

#[cfg(target_arch = "x86_64")]
impl Avx2 {
    /// [`Avx512::bn_grad_lanes`] in AVX2's 4-lane `f64` vectors, bit-identical to the portable
    /// loop: the sixteen partial sums of batch norm's `grad_sums` over `x` (value `k` into sum
    /// `k % 16`, the last partial block included), `(sum g, sum g * (x - m))`, `g` being `dy`
    /// stopped where `y` (when given) is not positive.
    #[inline(always)]
    pub(crate) fn bn_grad_lanes(
        self,
        x: &[f32],
        dy: &[f32],
        y: Option<&[f32]>,
        m: f64,
    ) -> ([f64; 16], [f64; 16]) {
        check_bn_grad_lengths(x, dy, y);
        // SAFETY: `self` exists only on a CPU with AVX2; the lengths are checked above.
        unsafe { x86::bn_grad_lanes_avx2(x, dy, y, m) }
    }
}

/// The vector instructions [`wide`] compiles for on this CPU: `avx512f`, `avx2` or `portable`.
pub(crate) fn in_use() -> &'static str {
    Vectors::detect().name()
}

/// The lengths both `bn_grad_lanes` kernels read by: `dy` and `y` (when given) as long as `x`.
///
/// # Panics
/// Where they are not.
#[cfg(target_arch = "x86_64")]
fn check_bn_grad_lengths(x: &[f32], dy: &[f32], y: Option<&[f32]>) {
    assert!(
        x.len() == dy.len() && y.is_none_or(|y| y.len() == x.len()),
        "batch norm backward sums: lengths"
    );
}

/// Proof that this CPU runs AVX-512F: only [`Avx512::detect`] makes one (the field is private
/// to this module), after std's run-time detection. Functions that take one may run AVX-512F
/// instructions, so their safe signatures cannot be misused: without the CPU there is no
/// token to pass.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512 {
    _proof: (),
}

impl Avx512 {
    /// A token when the CPU runs AVX-512F and `EMBER_SIMD` does not ask for the portable loops.
    pub(crate) fn detect() -> Option<Self> {
        if crate::simd_setting() == crate::Simd::Portable {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx512f") {
            return Some(Self { _proof: () });
        }
        None
    }
}

/// Whether a row of `tw` tiles' 16 planes, `pitch` apart, fit in `len` floats: the planes hold
/// the tiles (`tw <= pitch`) and the last one ends by `15 * pitch + tw <= len`.
#[cfg(target_arch = "x86_64")]
fn tile_row_fits(tw: usize, pitch: usize, len: usize) -> bool {
    tw <= pitch
        && pitch
            .checked_mul(15)
            .and_then(|p| p.checked_add(tw))
            .is_some_and(|n| n <= len)
}

#[cfg(target_arch = "x86_64")]
impl Avx512 {
    /// Widest padded row [`Avx512::pad_zeros`] takes: its per-chunk masks live in a fixed
    /// array.
    pub(crate) const PAD_MAX_WIDTH: usize = 16 * 16;

    /// `padded`'s planes, `[h + 2 * ph, w + 2 * pw]` each, = `x`'s planes, `[h, w]`, with `ph`
    /// rows and `pw` columns of zeros around them: each padded row by whole 16-lane masked
    /// loads and stores, its zeros included (the masks are the same for every row), instead
    /// of scalar fills at both ends and a copy between. Returns `false`, writing nothing,
    /// where a padded row is wider than [`Avx512::PAD_MAX_WIDTH`].
    ///
    /// # Panics
    /// If `x` is not whole `[h, w]` planes (none when empty), or `padded` not as many padded
    /// ones.
    pub(crate) fn pad_zeros(
        self,
        padded: &mut [f32],
        x: &[f32],
        [h, w]: [usize; 2],
        [ph, pw]: [usize; 2],
    ) -> bool {
        // Computed checked: sizes that overflow `usize` fail here instead of wrapping to a
        // length that passes.
        let area = h.checked_mul(w).filter(|&a| a > 0);
        assert!(
            area.is_some_and(|a| x.len() % a == 0),
            "pad_zeros: x is not whole planes"
        );
        let side = |n: usize, p: usize| p.checked_mul(2).and_then(|p2| p2.checked_add(n));
        let (hn, wn) = (side(h, ph), side(w, pw));
        let want = area
            .zip(hn.zip(wn))
            .and_then(|(a, (hn, wn))| (x.len() / a).checked_mul(hn)?.checked_mul(wn));
        assert_eq!(Some(padded.len()), want, "pad_zeros: padded length");
        if wn.is_none_or(|wn| wn > Self::PAD_MAX_WIDTH) {
            return false;
        }
        // SAFETY: `self` proves AVX-512F; the lengths are checked above.
        unsafe { x86::pad_zeros(padded, x, [h, w], [ph, pw]) };
        true
    }

    /// `dst[j] = src[2 * j]` for `j < dst.len()`: 32 floats loaded, their even lanes
    /// gathered by one permute, 16 stored.
    ///
    /// # Panics
    /// If `dst` is empty or `src` shorter than `2 * dst.len() - 1`.
    #[inline(always)]
    pub(crate) fn copy_even(self, dst: &mut [f32], src: &[f32]) {
        assert!(
            !dst.is_empty() && src.len() >= 2 * dst.len() - 1,
            "copy_even: src too short"
        );
        // SAFETY: `self` proves AVX-512F; the lengths are checked above.
        unsafe { x86::copy_even(dst, src) }
    }

    /// Winograd F(2x2, 3x3)'s input transform `V = Bᵀ d B` of one row of tiles: `rows` are the
    /// four image rows the tile row reads (zeros above and below the image), padded by a zero
    /// column on each side (tile `k` covers padded columns `2k..2k + 4`, padded column `p` being
    /// column `p - 1`), and `V[ξ]` of tile `k` goes to `out[ξ * pitch + k]` for
    /// `k < tw = ceil(w / 2)`. Down: `d0 - d2`, `d1 + d2`, `d2 - d1`, `d1 - d3`; then the same
    /// across. 16 tiles at a time, the columns loaded from the rows themselves (masked where
    /// they fall in the padding) and split by permutes, in registers: building the padded row
    /// in memory first and loading it back one float off stalled on store forwarding (half of
    /// the transform's time).
    ///
    /// # Panics
    /// If the rows differ in length, `tw > pitch`, or `out` is shorter than `15 * pitch + tw`.
    #[inline(always)]
    pub(crate) fn winograd_input_row(self, rows: [&[f32]; 4], out: &mut [f32], pitch: usize) {
        let w = rows[0].len();
        let tw = w.div_ceil(2);
        assert!(
            rows.iter().all(|r| r.len() == w) && tile_row_fits(tw, pitch, out.len()),
            "winograd_input_row: lengths"
        );
        // SAFETY: `self` proves AVX-512F; the lengths are checked above.
        unsafe { x86::winograd_input_row(rows, out, pitch) }
    }

    /// Winograd F(2x2, 3x3)'s output-gradient transform `D = A dy Aᵀ` of one row of tiles: `a`
    /// and `b` are the tile row's two image rows (`b` `None` below the image: zeros), tile `k`
    /// covers columns `2k` and `2k + 1` (zero past the row), and `D[ξ]` of tile `k` goes to
    /// `out[ξ * pitch + k]` for `k < tw = ceil(a.len() / 2)`. Down: `a`, `a + b`, `a - b`,
    /// `0 - b`; then across each of those (`e`, `o` its two columns) `e`, `e + o`, `e - o`,
    /// `0 - o`: 16 tiles at a time from two loads and two permutes per row, in registers.
    ///
    /// # Panics
    /// If `b` is not `a`'s length, `tw > pitch`, or `out` is shorter than `15 * pitch + tw`.
    #[inline(always)]
    pub(crate) fn winograd_grad_row(self, a: &[f32], b: Option<&[f32]>, out: &mut [f32], pitch: usize) {
        let tw = a.len().div_ceil(2);
        assert!(
            b.is_none_or(|b| b.len() == a.len()) && tile_row_fits(tw, pitch, out.len()),
            "winograd_grad_row: lengths"
        );
        // SAFETY: `self` proves AVX-512F; the lengths are checked above.
        unsafe { x86::winograd_grad_row(a, b, out, pitch) }
    }

    /// Winograd F(2x2, 3x3)'s output transform `Y = Aᵀ M A` of one output plane `[h, w]`: tile
    /// `t` (`ceil(h / 2) x ceil(w / 2)` tiles, row-major) has its 16 sums at `m[ξ * pitch + t]`,
    /// and its 2x2 outputs that fall inside the plane go to `out`, plus `bias`, then
    /// `max(y, 0)` (NaN kept) when `relu`. Down: `m0 + m1 + m2`, `m1 - m2 - m3`; then the same
    /// across. 16 tiles at a time over the plane's tiles as they lie (tile rows one after the
    /// other), the two output columns interleaved by permutes and each run of tiles within a
    /// tile row stored by one masked store: the row loop it replaces ran on 4- to 16-tile rows
    /// that the compiler vectorised four floats at a time, or not at all.
    ///
    /// Every element of `out` is written.
    ///
    /// # Panics
    /// If `h` or `w` is 0, `out` is not `h * w` floats, or `m` does not hold the 16 planes'
    /// tiles (`tiles <= pitch`, `15 * pitch + tiles <= m.len()`).
    #[inline(always)]
    pub(crate) fn winograd_output_plane(
        self,
        m: &[f32],
        pitch: usize,
        [h, w]: [usize; 2],
        bias: f32,
        relu: bool,
        out: &mut [std::mem::MaybeUninit<f32>],
    ) {
        let tiles = h.div_ceil(2).checked_mul(w.div_ceil(2));
        assert!(
            h > 0 && w > 0 && h.checked_mul(w) == Some(out.len()),
            "winograd_output_plane: output length"
        );
        assert!(
            tiles.is_some_and(|t| tile_row_fits(t, pitch, m.len())),
            "winograd_output_plane: sums too short"
        );
        // SAFETY: `self` proves AVX-512F; the lengths are checked above.
        unsafe { x86::winograd_output_plane(m, pitch, [h, w], bias, relu, out) }
    }

    /// `dst = src` (same length) with masked 16-lane operations.
    #[inline(always)]
    pub(crate) fn copy_row(self, dst: &mut [f32], src: &[f32]) {
        // SAFETY: `self` exists only on a CPU with AVX-512F; `dst` is writable.
        unsafe { x86::copy_row(dst.as_mut_ptr(), dst.len(), src) }
    }

    /// [`Avx512::copy_row`] into a slice not yet written: every element is.
    #[inline(always)]
    pub(crate) fn write_row(self, dst: &mut [std::mem::MaybeUninit<f32>], src: &[f32]) {
        // SAFETY: as in `copy_row`.
        unsafe { x86::copy_row(dst.as_mut_ptr().cast(), dst.len(), src) }
    }

    /// `dst`'s rows of `width` floats (`dst.len()` a multiple of it) = the rows of `src` that
    /// start `pitch` floats apart: each row by one whole 16-lane load and store wherever 16
    /// floats from its start lie inside both slices (the surplus lanes land on the next rows,
    /// which are written after it), under masks elsewhere.
    ///
    /// # Panics
    /// If `width` is 0 or `dst.len()` not a multiple of it, or `src` is too short for the rows.
    #[inline(always)]
    pub(crate) fn copy_rows(self, dst: &mut [f32], src: &[f32], pitch: usize, width: usize) {
        assert!(width > 0 && dst.len() % width == 0, "copy_rows: rows");
        let rows = dst.len() / width;
        if rows > 0 {
            assert!(
                (rows - 1)
                    .checked_mul(pitch)
                    .and_then(|e| e.checked_add(width))
                    .is_some_and(|e| e <= src.len()),
                "copy_rows: src too short"
            );
        }
        // SAFETY: as in `copy_row`; the bounds `x86::copy_rows` needs are checked above.
        unsafe { x86::copy_rows(dst, src, pitch, width) }
    }

    /// `dst += src` (same length) with masked 16-lane operations.
    #[inline(always)]
    pub(crate) fn add_row(self, dst: &mut [f32], src: &[f32]) {
        // SAFETY: as in `copy_row`.
        unsafe { x86::add_row(dst, src) }
    }

    /// [`x86::shifted_conv`], with every bound that function needs checked here (a violation
    /// panics). The bounds of this and the direct kernels below are computed saturating: one
    /// that overflows `usize` fails its check instead of wrapping to a small value that passes.
    pub(crate) fn shifted_conv(self, c: &ShiftedConv<'_>, out: &mut [f32]) {
        let taps = c.shifts.len();
        assert!(
            c.channels > 0 && c.out_channels > 0 && taps > 0 && c.n > 0 && c.pitch >= c.n,
            "shifted_conv: empty shapes or a pitch below n"
        );
        assert_eq!(
            c.out_channels % x86::OB,
            0,
            "shifted_conv: output channels not a multiple of 4"
        );
        assert!(
            c.input.len() >= c.channels.saturating_mul(c.plane),
            "shifted_conv: input too short"
        );
        assert_eq!(
            c.packed.len(),
            c.out_channels.saturating_mul(c.channels).saturating_mul(taps),
            "shifted_conv: packed weights"
        );
        if let Some(b) = c.bias {
            assert_eq!(b.len(), c.out_channels, "shifted_conv: bias length");
        }
        // Every read `c * plane + shift + j` (j < n) stays in channel c's plane.
        assert!(
            c.shifts.iter().all(|&sh| sh.saturating_add(c.n) <= c.plane),
            "shifted_conv: a shift reads past its plane"
        );
        assert!(
            out.len() >= (c.out_channels - 1).saturating_mul(c.pitch).saturating_add(c.n),
            "shifted_conv: output too short"
        );
        // SAFETY: `self` exists only on a CPU with AVX-512F; the asserts above are the bounds
        // `x86::shifted_conv` requires.
        unsafe { x86::shifted_conv(c, out) }
    }

    /// [`x86::shifted_weight_grad`], with every bound that function needs checked here (a
    /// violation panics).
    pub(crate) fn shifted_weight_grad(self, g: &ShiftedWeightGrad<'_>, grad: &mut [f32]) {
        let taps = g.shifts.len();
        assert!(
            g.channels > 0 && g.out_channels > 0 && taps > 0 && g.n > 0 && g.dy_pitch >= g.n,
            "shifted_weight_grad: empty shapes or a pitch below n"
        );
        assert_eq!(
            g.out_channels % x86::OB,
            0,
            "shifted_weight_grad: output channels not a multiple of 4"
        );
        assert!(
            g.input.len() >= g.channels.saturating_mul(g.plane),
            "shifted_weight_grad: input too short"
        );
        // Every read `c * plane + shift + j` (j < n) stays in channel c's plane.
        assert!(
            g.shifts.iter().all(|&sh| sh.saturating_add(g.n) <= g.plane),
            "shifted_weight_grad: a shift reads past its plane"
        );
        assert!(
            g.dy.len()
                >= (g.out_channels - 1)
                    .saturating_mul(g.dy_pitch)
                    .saturating_add(g.n),
            "shifted_weight_grad: output gradient too short"
        );
        assert_eq!(
            grad.len(),
            g.channels.saturating_mul(taps).saturating_mul(g.out_channels),
            "shifted_weight_grad: gradient length"
        );
        // SAFETY: `self` exists only on a CPU with AVX-512F; the asserts above are the bounds
        // `x86::shifted_weight_grad` requires.
        unsafe { x86::shifted_weight_grad(g, grad) }
    }

    /// [`x86::lane_conv`], with every bound that function needs checked here (a violation
    /// panics).
    pub(crate) fn lane_conv(self, c: &LaneConv<'_>, out: &mut [f32]) {
        let taps = c.shifts.len();
        assert!(
            c.channels > 0 && taps > 0 && c.rows > 0 && c.block_channels > 0,
            "lane_conv: empty shapes"
        );
        assert!(
            (1..=LANE_MAX_WIDTH).contains(&c.width) && c.out_channels > 0 && c.out_channels % 32 == 0,
            "lane_conv: a row wider than 14 pixels or output channels not a multiple of 32"
        );
        assert!(
            c.input.len() >= c.channels.saturating_mul(c.plane),
            "lane_conv: input too short"
        );
        assert_eq!(
            c.packed.len(),
            c.out_channels.saturating_mul(c.channels).saturating_mul(taps),
            "lane_conv: packed weights"
        );
        if let Some(b) = c.bias {
            assert_eq!(b.len(), c.out_channels, "lane_conv: bias length");
        }
        // Every read `c * plane + shift + r * row_pitch + w` (r < rows, w < width) stays in
        // channel c's plane.
        let span = (c.rows - 1).saturating_mul(c.row_pitch).saturating_add(c.width);
        assert!(
            c.shifts.iter().all(|&sh| sh.saturating_add(span) <= c.plane),
            "lane_conv: a shift reads past its plane"
        );
        assert!(
            out.len() >= c.rows.saturating_mul(c.width).saturating_mul(c.out_channels),
            "lane_conv: output too short"
        );
        // SAFETY: `self` exists only on a CPU with AVX-512F; the asserts above are the bounds
        // `x86::lane_conv` requires.
        unsafe { x86::lane_conv(c, out) }
    }

    /// [`x86::lane_weight_grad`], with every bound that function needs checked here (a
    /// violation panics).
    pub(crate) fn lane_weight_grad(self, g: &LaneWeightGrad<'_>, grad: &mut [f32]) {
        assert!(
            g.channels > 0 && g.rows > 0 && g.width > 0 && g.out_channels > 0,
            "lane_weight_grad: empty shapes"
        );
        assert_eq!(
            g.out_channels % 32,
            0,
            "lane_weight_grad: output channels not a multiple of 32"
        );
        assert!(
            g.input.len() >= g.channels.saturating_mul(g.plane),
            "lane_weight_grad: input too short"
        );
        // Every read `c * plane + (r + i) * row_pitch + w + j` (r < rows, w < width, i, j < 3)
        // stays in channel c's plane.
        assert!(
            g.rows
                .saturating_add(1)
                .saturating_mul(g.row_pitch)
                .saturating_add(g.width)
                .saturating_add(2)
                <= g.plane,
            "lane_weight_grad: the taps read past a plane"
        );
        assert!(
            g.dy.len() >= g.rows.saturating_mul(g.width).saturating_mul(g.out_channels),
            "lane_weight_grad: output gradient too short"
        );
        assert_eq!(
            grad.len(),
            g.channels.saturating_mul(9).saturating_mul(g.out_channels),
            "lane_weight_grad: gradient length"
        );
        // SAFETY: `self` exists only on a CPU with AVX-512F; the asserts above are the bounds
        // `x86::lane_weight_grad` requires.
        unsafe { x86::lane_weight_grad(g, grad) }
    }

    /// The inverse of [`Self::pixels_to_planes`], from planes `stride` floats apart:
    /// `pixels[p * channels + c] = planes[c * stride + p]` for `p < pixels.len() / channels`,
    /// the 16 channels of a pixel per gather.
    ///
    /// # Panics
    /// If `channels` is not a multiple of 16, `pixels.len()` not a multiple of it, `stride`
    /// shorter than a plane, `planes` too short, or `channels * stride` is `i32::MAX` or more.
    pub(crate) fn planes_to_pixels(self, planes: &[f32], stride: usize, channels: usize, pixels: &mut [f32]) {
        assert!(channels > 0 && channels % 16 == 0, "planes_to_pixels: channels");
        assert_eq!(pixels.len() % channels, 0, "planes_to_pixels: pixels");
        let n = pixels.len() / channels;
        assert!(
            n <= stride
                && (n == 0 || (channels - 1).saturating_mul(stride).saturating_add(n) <= planes.len()),
            "planes_to_pixels: planes too short"
        );
        assert!(
            channels
                .checked_mul(stride)
                .is_some_and(|m| m < i32::MAX as usize),
            "planes_to_pixels: too long for i32 indices"
        );
        // SAFETY: `self` exists only on a CPU with AVX-512F; bounds checked above.
        unsafe { x86::planes_to_pixels(planes, stride, channels, pixels) }
    }

    /// `planes[c * pixels + p] = src[p * channels + c]` for `c < channels`, `p < pixels`:
    /// pixel-major values (as [`LaneConv`] writes them) into channel planes, 16 pixels of a
    /// channel per gather. Every element of `planes` is written.
    ///
    /// # Panics
    /// If `src` or `planes` is not `channels * pixels` long, or that is `i32::MAX` or more.
    pub(crate) fn pixels_to_planes(
        self,
        src: &[f32],
        channels: usize,
        planes: &mut [std::mem::MaybeUninit<f32>],
    ) {
        assert!(
            channels > 0 && planes.len() % channels == 0,
            "pixels_to_planes: channels"
        );
        assert_eq!(src.len(), planes.len(), "pixels_to_planes: lengths");
        assert!(
            src.len() < i32::MAX as usize,
            "pixels_to_planes: too long for i32 indices"
        );
        // SAFETY: `self` exists only on a CPU with AVX-512F; lengths checked above.
        unsafe { x86::pixels_to_planes(src, channels, planes) }
    }

    /// The sixteen partial sums of batch norm's `grad_sums` over `x` (value `k` into sum
    /// `k % 16`, the last partial block included) in vectors, bit-identical: `(sum g, sum g *
    /// (x - m))`, `g` being `dy` stopped where `y` (when given) is not positive.
    #[inline(always)]
    pub(crate) fn bn_grad_lanes(
        self,
        x: &[f32],
        dy: &[f32],
        y: Option<&[f32]>,
        m: f64,
    ) -> ([f64; 16], [f64; 16]) {
        check_bn_grad_lengths(x, dy, y);
        // SAFETY: `self` exists only on a CPU with AVX-512F; the lengths are checked above.
        unsafe { x86::bn_grad_lanes(x, dy, y, m) }
    }

    /// [`x86::pool_2x2_row`].
    #[inline(always)]
    pub(crate) fn pool_2x2_row(
        self,
        top: &[f32],
        bottom: &[f32],
        base: u32,
        in_w: u32,
        out: &mut [f32],
        argmax: &mut [u32],
    ) {
        // SAFETY: as in `copy_row`; the function checks its slices' lengths itself.
        unsafe { x86::pool_2x2_row(top, bottom, base, in_w, out, argmax) }
    }
}

/// The direct kernels' safe wrappers refuse shapes whose bounds overflow `usize` (products
/// that would wrap to a small value and pass a length check, then let the kernel read far past
/// its slices).
#[cfg(all(test, target_arch = "x86_64"))]
#[test]
fn direct_kernels_refuse_shapes_whose_bounds_overflow() {
    let Some(cpu) = Avx512::detect() else {
        eprintln!("skipped: this CPU has no AVX-512F (or EMBER_SIMD=portable)");
        return;
    };
    let refused = |what: &str, run: &dyn Fn()| {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
            .expect_err("an overflowing shape must panic");
        let msg = err
            .downcast_ref::<&str>()
            .map(|m| m.to_string())
            .or_else(|| err.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        assert!(msg.contains(what), "expected {what:?}, got {msg:?}");
    };
    let input = [0.0f32; 64];
    let huge = usize::MAX / 2 + 1; // 2 * huge wraps to 0
    let shifts = [0usize];
    let packed = [0.0f32; 32];
    refused("lane_conv: input too short", &|| {
        let conv = LaneConv {
            input: &input,
            channels: 2,
            plane: huge,
            shifts: &shifts,
            row_pitch: 1,
            rows: 1,
            width: 1,
            packed: &packed,
            bias: None,
            out_channels: 32,
            block_channels: 1,
            ahead: Ahead::default(),
        };
        cpu.lane_conv(&conv, &mut [0.0; 32]);
    });
    let dy = [0.0f32; 32];
    refused("lane_weight_grad: input too short", &|| {
        let grad = LaneWeightGrad {
            input: &input,
            channels: 2,
            plane: huge,
            row_pitch: 1,
            rows: 1,
            width: 1,
            dy: &dy,
            out_channels: 32,
        };
        cpu.lane_weight_grad(&grad, &mut [0.0; 2 * 9 * 32]);
    });
    refused("lane_weight_grad: the taps read past a plane", &|| {
        let grad = LaneWeightGrad {
            input: &input,
            channels: 1,
            plane: 64,
            row_pitch: huge,
            rows: 1,
            width: 1,
            dy: &dy,
            out_channels: 32,
        };
        cpu.lane_weight_grad(&grad, &mut [0.0; 9 * 32]);
    });
    refused("shifted_conv: input too short", &|| {
        let conv = ShiftedConv {
            input: &input,
            channels: 2,
            plane: huge,
            shifts: &shifts,
            packed: &packed[..8],
            bias: None,
            out_channels: 4,
            n: 1,
            pitch: 1,
            ahead: Ahead::default(),
        };
        cpu.shifted_conv(&conv, &mut [0.0; 4]);
    });
    // (2^63 + 1) padded rows of 2 floats wrap to 2 floats.
    refused("pad_zeros: padded length", &|| {
        cpu.pad_zeros(&mut [0.0; 2], &[1.0, 2.0], [1, 2], [1 << 62, 0]);
    });
}

#[cfg(test)]
#[test]
fn the_environment_can_force_the_portable_loops() {
    match crate::simd_setting() {
        crate::Simd::Portable => assert!(Avx512::detect().is_none()),
        #[cfg(target_arch = "x86_64")]
        crate::Simd::Auto => assert_eq!(
            Avx512::detect().is_some(),
            std::is_x86_feature_detected!("avx512f")
        ),
        #[cfg(not(target_arch = "x86_64"))]
        crate::Simd::Auto => assert!(Avx512::detect().is_none()),
    }
    eprintln!("vector instructions: {}", crate::simd_in_use());
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// One line into L2 (`_MM_HINT_T1`: L1 holds the kernel's own tiles).
    #[inline(always)]
    fn prefetch(address: usize) {
        let line = std::ptr::without_provenance::<i8>(address);
        // SAFETY: a prefetch is a hint: it never faults, whatever the address, and neither
        // reads nor writes memory as far as the program can observe.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(line) };
    }

    /// Output channels per register tile of [`shifted_conv`], and 16-pixel vectors per tile.
    pub(crate) const OB: usize = super::CONV_OB;
    const JB: usize = 6;

    /// [`super::ShiftedConv`]'s convolution, in register tiles of 4 output channels x 96
    /// pixels: per channel and tap, six vector loads and four broadcast weights feed 24 FMAs.
    /// The sum for each output runs over `c`, then `t`, in order.
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `input` holds `channels * plane` floats, `shifts[t] + n <= plane`
    /// for every tap, `packed` holds `out_channels * channels * taps` floats, `out_channels` is a
    /// multiple of 4, `bias` (when given) holds `out_channels`, and `out` holds at least
    /// `(out_channels - 1) * pitch + n` floats.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn shifted_conv(conv: &super::ShiftedConv<'_>, out: &mut [f32]) {
        let super::ShiftedConv {
            input,
            channels,
            plane,
            shifts,
            packed,
            bias,
            out_channels,
            n,
            pitch,
            ahead,
        } = *conv;
        let taps = shifts.len();
        let (inp, outp) = (input.as_ptr(), out.as_mut_ptr());
        let mut ahead = super::Lines::new(ahead, out_channels / OB * n.div_ceil(16 * JB) * channels);
        for ob in 0..out_channels / OB {
            let w_block = &packed[ob * channels * taps * OB..][..channels * taps * OB];
            let b: [f32; OB] = std::array::from_fn(|o| bias.map_or(0.0, |b| b[ob * OB + o]));
            let mut j0 = 0;
            while j0 < n {
                let masks: [__mmask16; JB] =
                    std::array::from_fn(|v| lanes(n.saturating_sub(j0 + 16 * v).min(16)));
                let mut acc = [[_mm512_setzero_ps(); JB]; OB];
                for o in 0..OB {
                    for a in acc[o].iter_mut() {
                        *a = _mm512_set1_ps(b[o]);
                    }
                }
                let tile = ConvTile {
                    input: inp.wrapping_add(j0),
                    plane,
                    channels,
                    shifts,
                    weights: w_block,
                };
                // SAFETY: the caller's bounds; a whole tile (`j0 + 96 <= n`) reads its 96
                // pixels of every shifted row unmasked.
                acc = unsafe {
                    if j0 + 16 * JB <= n {
                        conv_tile::<false>(acc, &tile, &masks, &mut ahead)
                    } else {
                        conv_tile::<true>(acc, &tile, &masks, &mut ahead)
                    }
                };
                for o in 0..OB {
                    let row = outp.wrapping_add((ob * OB + o) * pitch + j0);
                    for v in 0..JB {
                        // SAFETY: unmasked lanes are at `o * pitch + j` with j < n, inside
                        // `out` (caller's bounds).
                        unsafe { _mm512_mask_storeu_ps(row.wrapping_add(16 * v), masks[v], acc[o][v]) };
                    }
                }
                j0 += 16 * JB;
            }
        }
    }

    /// Input positions `(c, t)` per register tile of [`shifted_weight_grad`].
    const QB: usize = 6;

    /// [`super::ShiftedWeightGrad`]'s gradient, in register tiles of 4 output channels x 6
    /// input positions `q = c * taps + t`: per 16 pixels, four loads of the output gradient and
    /// six shifted loads of the input feed 24 FMAs. Each sum runs over the pixels lane by lane
    /// (lane `l` takes the pixels `j` with `j % 16 == l`, in order), and the sixteen lanes are
    /// added by `_mm512_reduce_add_ps` before the result is added to `grad`. Only the last 16
    /// pixels are loaded under a mask: a masked load costs an extra operation on the ports the
    /// FMAs run on.
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `input` holds `channels * plane` floats, `shifts[t] + n <= plane`
    /// for every tap, `out_channels` is a multiple of 4, `dy` holds at least `(out_channels -
    /// 1) * dy_pitch + n` floats, and `grad` holds `channels * taps * out_channels`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn shifted_weight_grad(g: &super::ShiftedWeightGrad<'_>, grad: &mut [f32]) {
        let super::ShiftedWeightGrad {
            input,
            channels,
            plane,
            shifts,
            dy,
            dy_pitch,
            out_channels,
            n,
        } = *g;
        let taps = shifts.len();
        let positions = channels * taps;
        let (inp, dyp) = (input.as_ptr(), dy.as_ptr());
        // `n` in whole vectors, then the last one (1 to 16 pixels) under a mask.
        let (whole, last) = ((n - 1) / 16 * 16, lanes(n - (n - 1) / 16 * 16));
        for ob in 0..out_channels / OB {
            let dy_o: [*const f32; OB] = std::array::from_fn(|o| dyp.wrapping_add((ob * OB + o) * dy_pitch));
            for q0 in (0..positions).step_by(QB) {
                let qn = (positions - q0).min(QB);
                // A last tile with fewer than 6 positions repeats its last one (read, never
                // stored), so that every load stays in bounds.
                let at: [*const f32; QB] = std::array::from_fn(|i| {
                    let q = q0 + i.min(qn - 1);
                    inp.wrapping_add(q / taps * plane + shifts[q % taps])
                });
                let mut acc = [[_mm512_setzero_ps(); QB]; OB];
                for j in (0..whole).step_by(16) {
                    // SAFETY: j + 16 <= whole < n: 16 pixels inside both slices.
                    acc = unsafe { weight_grad_step::<false>(acc, &dy_o, &at, j, last) };
                }
                // SAFETY: the last `n - whole` pixels inside both slices, the rest not read.
                acc = unsafe { weight_grad_step::<true>(acc, &dy_o, &at, whole, last) };
                for i in 0..qn {
                    for o in 0..OB {
                        grad[(q0 + i) * out_channels + ob * OB + o] += _mm512_reduce_add_ps(acc[o][i]);
                    }
                }
            }
        }
    }

    /// One step of [`shifted_weight_grad`]'s tile: 16 pixels from `j` (under `mask` when
    /// `MASKED`, as [`conv_tile`]) of the output gradient rows `dy_o` and the shifted input rows
    /// `at`, multiplied and added into `acc`. Taken and returned by value, so that the
    /// accumulators stay in registers.
    ///
    /// # Safety
    /// The CPU runs AVX-512F; each pointer plus `j` is followed by 16 readable floats, or when
    /// `MASKED`, by as many as `mask`'s lanes (masked-off lanes are not read).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn weight_grad_step<const MASKED: bool>(
        mut acc: [[__m512; QB]; OB],
        dy_o: &[*const f32; OB],
        at: &[*const f32; QB],
        j: usize,
        mask: __mmask16,
    ) -> [[__m512; QB]; OB] {
        // SAFETY: the caller's bounds.
        let load = |p: *const f32| unsafe {
            if MASKED {
                _mm512_maskz_loadu_ps(mask, p.wrapping_add(j))
            } else {
                _mm512_loadu_ps(p.wrapping_add(j))
            }
        };
        let d: [__m512; OB] = std::array::from_fn(|o| load(dy_o[o]));
        for i in 0..QB {
            let x = load(at[i]);
            for o in 0..OB {
                acc[o][i] = _mm512_fmadd_ps(d[o], x, acc[o][i]);
            }
        }
        acc
    }

    /// One register tile of a direct convolution ([`shifted_conv`]: 96 pixels, [`lane_rows`]:
    /// one output row) from `input` (already offset to the tile's first pixel) of each of
    /// `channels` planes, shifted by each tap.
    struct ConvTile<'a> {
        input: *const f32,
        plane: usize,
        channels: usize,
        shifts: &'a [usize],
        /// The tile's output channels' weights, `[channels][taps][4]` for [`shifted_conv`],
        /// `[channels][taps][16 * V]` for [`lane_rows`].
        weights: &'a [f32],
    }

    /// [`shifted_conv`]'s sums over the channels and taps for one tile, onto `acc`: unmasked
    /// loads unless `MASKED` (a masked load costs an extra operation on the ports the FMAs run
    /// on: 6 per 24 FMAs). Taken and returned by value, so that the accumulators stay in
    /// registers.
    ///
    /// # Safety
    /// The CPU runs AVX-512F; for every channel `c` and shift `sh`, `input + c * plane + sh` is
    /// followed by 96 readable floats, or when `MASKED`, by those of `masks`' lanes (16 floats
    /// per vector; masked-off lanes are not read).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn conv_tile<const MASKED: bool>(
        mut acc: [[__m512; JB]; OB],
        tile: &ConvTile<'_>,
        masks: &[__mmask16; JB],
        ahead: &mut super::Lines,
    ) -> [[__m512; JB]; OB] {
        let taps = tile.shifts.len();
        for c in 0..tile.channels {
            ahead.step(prefetch);
            let base = tile.input.wrapping_add(c * tile.plane);
            let w_c = &tile.weights[c * taps * OB..][..taps * OB];
            for (t, &sh) in tile.shifts.iter().enumerate() {
                let p = base.wrapping_add(sh);
                // SAFETY: the caller's bounds; addresses are formed with `wrapping_add`.
                let x: [__m512; JB] = std::array::from_fn(|v| unsafe {
                    if MASKED {
                        _mm512_maskz_loadu_ps(masks[v], p.wrapping_add(16 * v))
                    } else {
                        _mm512_loadu_ps(p.wrapping_add(16 * v))
                    }
                });
                let w = &w_c[t * OB..][..OB];
                for o in 0..OB {
                    let wv = _mm512_set1_ps(w[o]);
                    for v in 0..JB {
                        acc[o][v] = _mm512_fmadd_ps(wv, x[v], acc[o][v]);
                    }
                }
            }
        }
        acc
    }

    /// [`super::LaneConv`]'s convolution, in register tiles of `V` vectors of output channels
    /// x one output row of `R` pixels: per channel and tap, `V` weight loads and `R` broadcast
    /// input pixels feed `V * R` FMAs (2 x 14 or 4 x 7: 28 accumulators).
    ///
    /// # Safety
    /// The CPU runs AVX-512F and `c` meets the bounds [`super::Avx512::lane_conv`] checks.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn lane_conv(c: &super::LaneConv<'_>, out: &mut [f32]) {
        macro_rules! by_width {
            ($v:literal; $($r:literal)*) => {
                match c.width {
                    // SAFETY: the caller's bounds; `R` is the row's width.
                    $($r => unsafe { lane_rows::<$v, $r>(c, out) },)*
                    w => unreachable!("lane_conv: width {w}"),
                }
            };
        }
        if super::lane_vectors(c.out_channels, c.width) == 4 {
            by_width!(4; 1 2 3 4 5 6 7)
        } else {
            by_width!(2; 1 2 3 4 5 6 7 8 9 10 11 12 13 14)
        }
    }

    /// [`lane_conv`] for `V` vectors of output channels on rows of `R` pixels.
    ///
    /// # Safety
    /// As [`lane_conv`]; `R` is `c.width` and `V` is [`super::lane_vectors`].
    #[target_feature(enable = "avx512f")]
    unsafe fn lane_rows<const V: usize, const R: usize>(c: &super::LaneConv<'_>, out: &mut [f32]) {
        let taps = c.shifts.len();
        let block = 16 * V;
        let (inp, outp) = (c.input.as_ptr(), out.as_mut_ptr());
        let tiles = c.out_channels / block * c.channels * c.rows;
        let mut ahead = super::Lines::new(c.ahead, tiles);
        for ob in 0..c.out_channels / block {
            let weights = &c.packed[ob * c.channels * taps * block..][..c.channels * taps * block];
            let bias: [__m512; V] = std::array::from_fn(|v| match c.bias {
                // SAFETY: `ob * block + 16 * v + 16 <= out_channels`, the bias's length.
                Some(b) => unsafe { _mm512_loadu_ps(b.as_ptr().add(ob * block + 16 * v)) },
                None => _mm512_setzero_ps(),
            });
            for c0 in (0..c.channels).step_by(c.block_channels) {
                let cn = c.block_channels.min(c.channels - c0);
                let first = c0 == 0;
                for row in 0..c.rows {
                    let o_row = outp.wrapping_add(row * R * c.out_channels + ob * block);
                    let acc = [if first { bias } else { [_mm512_setzero_ps(); V] }; R];
                    let tile = ConvTile {
                        input: inp.wrapping_add(c0 * c.plane + row * c.row_pitch),
                        plane: c.plane,
                        channels: cn,
                        shifts: c.shifts,
                        weights: &weights[c0 * taps * block..][..cn * taps * block],
                    };
                    // SAFETY: the caller's bounds: the tile's channels, shifted by any tap,
                    // hold its row's R pixels.
                    let acc = unsafe { lane_tile::<V, R>(acc, &tile, &mut ahead) };
                    for (r, acc) in acc.iter().enumerate() {
                        for (v, &a) in acc.iter().enumerate() {
                            let p = o_row.wrapping_add(r * c.out_channels + 16 * v);
                            // SAFETY: pixel `row * R + r` < rows * width, channel `ob * block
                            // + 16 * v + 15` < out_channels: inside `out`.
                            unsafe {
                                let sum = if first {
                                    a
                                } else {
                                    _mm512_add_ps(_mm512_loadu_ps(p), a)
                                };
                                _mm512_storeu_ps(p, sum);
                            }
                        }
                    }
                }
            }
        }
    }

    /// [`lane_rows`]' sums over the tile's channels and taps onto `acc`, each in order (`c`,
    /// then `t`). Taken and returned by value, so that the accumulators stay in registers.
    ///
    /// # Safety
    /// The CPU runs AVX-512F; for every channel `c < channels` and shift `sh`, `input + c *
    /// plane + sh` is followed by `R` readable floats; `weights` holds `channels * taps * 16 *
    /// V` floats.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn lane_tile<const V: usize, const R: usize>(
        mut acc: [[__m512; V]; R],
        tile: &ConvTile<'_>,
        ahead: &mut super::Lines,
    ) -> [[__m512; V]; R] {
        let taps = tile.shifts.len();
        let w = tile.weights.as_ptr();
        for c in 0..tile.channels {
            ahead.step(prefetch);
            let base = tile.input.wrapping_add(c * tile.plane);
            for (t, &sh) in tile.shifts.iter().enumerate() {
                let p = base.wrapping_add(sh);
                let wt = w.wrapping_add((c * taps + t) * 16 * V);
                // SAFETY: `(c * taps + t + 1) * 16 * V` floats are in `weights`.
                let wv: [__m512; V] = std::array::from_fn(|v| unsafe { _mm512_loadu_ps(wt.add(16 * v)) });
                for (r, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: the caller's bounds: `p + r` for r < R is readable.
                    let x = _mm512_set1_ps(unsafe { *p.add(r) });
                    for v in 0..V {
                        acc[v] = _mm512_fmadd_ps(wv[v], x, acc[v]);
                    }
                }
            }
        }
        acc
    }

    /// [`super::LaneWeightGrad`]'s gradient, per input channel and block of 32 output
    /// channels: 9 taps x 2 vectors of output channels in 18 accumulators; per output pixel,
    /// two loads of its output gradient and nine broadcast input pixels (three rows of three)
    /// feed 18 FMAs.
    ///
    /// # Safety
    /// The CPU runs AVX-512F and `g` meets the bounds [`super::Avx512::lane_weight_grad`]
    /// checks.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn lane_weight_grad(g: &super::LaneWeightGrad<'_>, grad: &mut [f32]) {
        let o_n = g.out_channels;
        let (inp, dyp) = (g.input.as_ptr(), g.dy.as_ptr());
        for c in 0..g.channels {
            let rows: [*const f32; 3] =
                std::array::from_fn(|i| inp.wrapping_add(c * g.plane + i * g.row_pitch));
            for ob in (0..o_n).step_by(32) {
                let mut acc = [[_mm512_setzero_ps(); 2]; 9];
                for r in 0..g.rows {
                    for w in 0..g.width {
                        let d = dyp.wrapping_add((r * g.width + w) * o_n + ob);
                        let px = r * g.row_pitch + w;
                        // SAFETY: pixel `r * width + w` < rows * width, channels `ob..ob + 32`
                        // <= out_channels: inside `dy`; `px + i * row_pitch + j` for i, j < 3
                        // inside channel c's plane (the caller's bounds).
                        unsafe {
                            let dv = [_mm512_loadu_ps(d), _mm512_loadu_ps(d.add(16))];
                            for (i, row) in rows.iter().enumerate() {
                                for j in 0..3 {
                                    let x = _mm512_set1_ps(*row.add(px + j));
                                    for v in 0..2 {
                                        acc[i * 3 + j][v] = _mm512_fmadd_ps(dv[v], x, acc[i * 3 + j][v]);
                                    }
                                }
                            }
                        }
                    }
                }
                for (t, acc) in acc.iter().enumerate() {
                    let at = &mut grad[(c * 9 + t) * o_n + ob..][..32];
                    for (v, &a) in acc.iter().enumerate() {
                        // SAFETY: 16 floats at `16 * v` inside `at` (32 long).
                        unsafe {
                            let p = at.as_mut_ptr().add(16 * v);
                            _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), a));
                        }
                    }
                }
            }
        }
    }

    /// [`super::Avx512::planes_to_pixels`].
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `channels` is a multiple of 16 and of `pixels.len()`, `planes`
    /// holds `(channels - 1) * stride + pixels.len() / channels` floats (when that is not 0),
    /// and `channels * stride` is less than `i32::MAX`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn planes_to_pixels(
        planes: &[f32],
        stride: usize,
        channels: usize,
        pixels: &mut [f32],
    ) {
        let step = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(stride as i32),
        );
        for (p, px) in pixels.chunks_exact_mut(channels).enumerate() {
            for c0 in (0..channels).step_by(16) {
                // Lane `l` reads `planes[(c0 + l) * stride + p]`: c0 + l < channels, p < n.
                let at = planes.as_ptr().wrapping_add(c0 * stride + p);
                // SAFETY: as above; `c0 + 16 <= channels` floats of `px`.
                unsafe {
                    let v = _mm512_i32gather_ps::<4>(step, at.cast());
                    _mm512_storeu_ps(px.as_mut_ptr().add(c0), v);
                }
            }
        }
    }

    /// [`super::Avx512::pixels_to_planes`].
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `src` and `planes` are `channels * pixels` long, less than
    /// `i32::MAX`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pixels_to_planes(
        src: &[f32],
        channels: usize,
        planes: &mut [std::mem::MaybeUninit<f32>],
    ) {
        let pixels = planes.len() / channels;
        let step = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(channels as i32),
        );
        for (ch, plane) in planes.chunks_exact_mut(pixels).enumerate() {
            for p0 in (0..pixels).step_by(16) {
                let k = lanes((pixels - p0).min(16));
                // Lane `l` reads `src[(p0 + l) * channels + ch]`, inside `src` for the lanes
                // of `k` (`p0 + l < pixels`); the others are not read.
                let at = src.as_ptr().wrapping_add(p0 * channels + ch);
                // SAFETY: as above; lanes `p0..p0 + popcount(k)` lie inside `plane`.
                unsafe {
                    let v = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), k, step, at.cast());
                    _mm512_mask_storeu_ps(plane.as_mut_ptr().add(p0).cast(), k, v);
                }
            }
        }
    }

    /// [`super::Avx512::bn_grad_lanes`]: lane `l` of the two `f64` vector pairs holds the
    /// portable loop's partial sum `l` (elements `k + l` of each block), added to in the same
    /// order with the same operations (a multiply, then an add: no FMA).
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `dy` and `y` (when given) are as long as `x`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn bn_grad_lanes(
        x: &[f32],
        dy: &[f32],
        y: Option<&[f32]>,
        m: f64,
    ) -> ([f64; 16], [f64; 16]) {
        let mv = _mm512_set1_pd(m);
        let (mut sum, mut dot) = ([_mm512_setzero_pd(); 2], [_mm512_setzero_pd(); 2]);
        for k in (0..x.len()).step_by(16) {
            // The block's lanes (fewer than 16 only in the last block), and of those, the ones
            // kept: all, or those where `y` is not `<= 0` (NaN included, as `y <= 0.0` is false
            // there). Lanes outside the block are neither read nor added to.
            let n = lanes((x.len() - k).min(16));
            let keep: u16 = match y {
                // SAFETY: lanes `k..k + popcount(n)` lie inside `y` (as long as `x`).
                Some(y) => unsafe {
                    let y = _mm512_maskz_loadu_ps(n, y.as_ptr().add(k));
                    _mm512_mask_cmp_ps_mask::<_CMP_NLE_UQ>(n, y, _mm512_setzero_ps())
                },
                None => n,
            };
            // SAFETY: as for `y`, in `dy` and `x`.
            let (d, v) = unsafe {
                (
                    _mm512_maskz_loadu_ps(n, dy.as_ptr().add(k)),
                    _mm512_maskz_loadu_ps(n, x.as_ptr().add(k)),
                )
            };
            for h in 0..2 {
                let half = |v: __m512| {
                    let v = _mm512_castps_pd(v);
                    let v = if h == 0 {
                        v
                    } else {
                        _mm512_shuffle_f64x2::<0b11_10_11_10>(v, v)
                    };
                    _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_castpd512_pd256(v)))
                };
                let (d, v, part) = (half(d), half(v), (n >> (8 * h)) as u8);
                let g = _mm512_maskz_mov_pd((keep >> (8 * h)) as u8, d);
                sum[h] = _mm512_mask_add_pd(sum[h], part, sum[h], g);
                let t = _mm512_mul_pd(g, _mm512_sub_pd(v, mv));
                dot[h] = _mm512_mask_add_pd(dot[h], part, dot[h], t);
            }
        }
        let lanes = |v: [__m512d; 2]| {
            let mut a = [0.0f64; 16];
            // SAFETY: `a` holds 16 f64s, two vectors.
            unsafe {
                _mm512_storeu_pd(a.as_mut_ptr(), v[0]);
                _mm512_storeu_pd(a.as_mut_ptr().add(8), v[1]);
            }
            a
        };
        (lanes(sum), lanes(dot))
    }

    /// [`super::Avx2::bn_grad_lanes`]: the whole blocks of 16 in four pairs of 4-lane `f64`
    /// vectors (lane `l` of vector `v` holding the portable loop's partial sum `4 * v + l`),
    /// added to in the same order with the same operations (a multiply, then an add: no FMA);
    /// the last partial block, if any, one value at a time into the stored sums, as the
    /// portable loop does.
    ///
    /// # Safety
    /// The CPU runs AVX2; `dy` and `y` (when given) are as long as `x`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) unsafe fn bn_grad_lanes_avx2(
        x: &[f32],
        dy: &[f32],
        y: Option<&[f32]>,
        m: f64,
    ) -> ([f64; 16], [f64; 16]) {
        let mv = _mm256_set1_pd(m);
        let (mut sum, mut dot) = ([_mm256_setzero_pd(); 4], [_mm256_setzero_pd(); 4]);
        let whole = x.len() / 16 * 16;
        for k in (0..whole).step_by(16) {
            for q in 0..4 {
                let at = k + 4 * q;
                // SAFETY: `at + 4 <= whole <= x.len()`, and `dy` and `y` are as long as `x`.
                let (d, v) = unsafe {
                    let d = _mm_loadu_ps(dy.as_ptr().add(at));
                    let d = match y {
                        // `y <= 0` false (NaN included) keeps the gradient; else +0.0, as
                        // `pool_gate` gives.
                        Some(y) => {
                            let y = _mm_loadu_ps(y.as_ptr().add(at));
                            _mm_and_ps(d, _mm_cmp_ps::<_CMP_NLE_UQ>(y, _mm_setzero_ps()))
                        }
                        None => d,
                    };
                    (d, _mm_loadu_ps(x.as_ptr().add(at)))
                };
                let (g, v) = (_mm256_cvtps_pd(d), _mm256_cvtps_pd(v));
                sum[q] = _mm256_add_pd(sum[q], g);
                dot[q] = _mm256_add_pd(dot[q], _mm256_mul_pd(g, _mm256_sub_pd(v, mv)));
            }
        }
        let lanes = |v: [__m256d; 4]| {
            let mut a = [0.0f64; 16];
            for (q, v) in v.into_iter().enumerate() {
                // SAFETY: `a` holds 16 f64s, four vectors of 4.
                unsafe { _mm256_storeu_pd(a.as_mut_ptr().add(4 * q), v) };
            }
            a
        };
        let (mut sum, mut dot) = (lanes(sum), lanes(dot));
        for k in whole..x.len() {
            let g = match y {
                Some(y) if y[k] <= 0.0 => 0.0,
                _ => f64::from(dy[k]),
            };
            sum[k % 16] += g;
            dot[k % 16] += g * (f64::from(x[k]) - m);
        }
        (sum, dot)
    }

    /// The first `n` (at most 16) lanes.
    #[inline(always)]
    fn lanes(n: usize) -> __mmask16 {
        debug_assert!(n <= 16);
        ((1u32 << n) - 1) as __mmask16
    }

    /// [`super::Avx512::copy_even`].
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `dst` is not empty and `src` holds `2 * dst.len() - 1` floats.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn copy_even(dst: &mut [f32], src: &[f32]) {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let (d, s, n) = (dst.as_mut_ptr(), src.as_ptr(), dst.len());
        let mut j = 0;
        while j < n {
            let k = (n - j).min(16);
            // Outputs `j..j + k` read `src[2 * j..2 * (j + k) - 1]`.
            // SAFETY: loaded lanes lie below `2 * (j + k) - 1 <= 2 * n - 1 <= src.len()`
            // (`pair`), stored ones below `j + k <= n`; masked-off lanes are not accessed.
            unsafe {
                let (a, b) = pair(s, 2 * j, 2 * (j + k) - 1);
                _mm512_mask_storeu_ps(d.wrapping_add(j), lanes(k), _mm512_permutex2var_ps(a, even, b));
            }
            j += 16;
        }
    }

    /// [`super::Avx512::winograd_input_row`].
    ///
    /// # Safety
    /// The CPU runs AVX-512F; the rows have one length `w`, and `out` holds at least
    /// `15 * pitch + ceil(w / 2)` floats with `ceil(w / 2) <= pitch`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn winograd_input_row(rows: [&[f32]; 4], out: &mut [f32], pitch: usize) {
        let tw = rows[0].len().div_ceil(2);
        let d = out.as_mut_ptr();
        let mut j = 0;
        while j < tw {
            let m = (tw - j).min(16);
            // Tile `j + l` reads padded columns `2(j + l)..2(j + l) + 4`: x0, x1 from the 32
            // starting at `2j`, x2, x3 from the 32 starting at `2j + 2`, per row.
            // SAFETY: the CPU runs AVX-512F (this function's own requirement).
            let [d0, d1, d2, d3] = unsafe {
                [
                    tile_columns(rows[0], j),
                    tile_columns(rows[1], j),
                    tile_columns(rows[2], j),
                    tile_columns(rows[3], j),
                ]
            };
            // Bᵀ's rows, down, per column: d0 - d2, d1 + d2, d2 - d1, d1 - d3.
            let each = |a: [__m512; 4], b: [__m512; 4], add: bool| -> [__m512; 4] {
                let f = |k: usize| {
                    if add {
                        _mm512_add_ps(a[k], b[k])
                    } else {
                        _mm512_sub_ps(a[k], b[k])
                    }
                };
                [f(0), f(1), f(2), f(3)]
            };
            let t = [
                each(d0, d2, false),
                each(d1, d2, true),
                each(d2, d1, false),
                each(d1, d3, false),
            ];
            let store = lanes(m);
            for (i, [x0, x1, x2, x3]) in t.into_iter().enumerate() {
                let at = d.wrapping_add(4 * i * pitch + j);
                // SAFETY: lanes `j..j + m` of planes `4i..4i + 4`: below `15 * pitch + tw`.
                unsafe {
                    _mm512_mask_storeu_ps(at, store, _mm512_sub_ps(x0, x2));
                    _mm512_mask_storeu_ps(at.wrapping_add(pitch), store, _mm512_add_ps(x1, x2));
                    _mm512_mask_storeu_ps(at.wrapping_add(2 * pitch), store, _mm512_sub_ps(x2, x1));
                    _mm512_mask_storeu_ps(at.wrapping_add(3 * pitch), store, _mm512_sub_ps(x1, x3));
                }
            }
            j += 16;
        }
    }

    /// Columns `x0..x3` of tiles `j..j + 16` of a row padded by one zero column on each side
    /// (tile `k` covers padded columns `2k..2k + 4`), zero outside the row.
    ///
    /// # Safety
    /// The CPU runs AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tile_columns(row: &[f32], j: usize) -> [__m512; 4] {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        // SAFETY: `padded` loads only lanes of columns inside the row.
        let (a, b, c, e) = unsafe {
            (
                padded(row, 2 * j),
                padded(row, 2 * j + 16),
                padded(row, 2 * j + 2),
                padded(row, 2 * j + 18),
            )
        };
        [
            _mm512_permutex2var_ps(a, even, b),
            _mm512_permutex2var_ps(a, odd, b),
            _mm512_permutex2var_ps(c, even, e),
            _mm512_permutex2var_ps(c, odd, e),
        ]
    }

    /// Padded columns `p..p + 16` of `row` (padded column `q` is `row[q - 1]`), zero where
    /// that falls outside the row.
    ///
    /// # Safety
    /// The CPU runs AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn padded(row: &[f32], p: usize) -> __m512 {
        // Lane `l` reads `row[p + l - 1]` where `1 <= p + l <= row.len()`.
        let below = row.len() + 1;
        let count = below.saturating_sub(p).min(16);
        let mask = lanes(count) & if p == 0 { !1 } else { !0 };
        // SAFETY: the loaded lanes' indices lie in `0..row.len()` (above); masked-off lanes are
        // not accessed, and the address is formed by wrapping arithmetic only.
        unsafe { _mm512_maskz_loadu_ps(mask, row.as_ptr().wrapping_add(p).wrapping_sub(1)) }
    }

    /// [`super::Avx512::winograd_grad_row`].
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `b` (when given) is `a`'s length, and `out` holds at least
    /// `15 * pitch + ceil(a.len() / 2)` floats with `ceil(a.len() / 2) <= pitch`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn winograd_grad_row(a: &[f32], b: Option<&[f32]>, out: &mut [f32], pitch: usize) {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        let (w, tw) = (a.len(), a.len().div_ceil(2));
        let d = out.as_mut_ptr();
        let zero = _mm512_setzero_ps();
        let mut j = 0;
        while j < tw {
            let m = (tw - j).min(16);
            // Tiles `j..j + m` read columns `2j..min(2(j + m), w)`.
            let end = (2 * (j + m)).min(w);
            // SAFETY: `pair` reads below `end <= w`, the rows' length.
            let split = |row: &[f32]| {
                let (lo, hi) = unsafe { pair(row.as_ptr(), 2 * j, end) };
                (
                    _mm512_permutex2var_ps(lo, even, hi),
                    _mm512_permutex2var_ps(lo, odd, hi),
                )
            };
            let (ae, ao) = split(a);
            let (be, bo) = b.map_or((zero, zero), split);
            let rows = [
                (ae, ao),
                (_mm512_add_ps(ae, be), _mm512_add_ps(ao, bo)),
                (_mm512_sub_ps(ae, be), _mm512_sub_ps(ao, bo)),
                (_mm512_sub_ps(zero, be), _mm512_sub_ps(zero, bo)),
            ];
            let store = lanes(m);
            for (i, (e, o)) in rows.into_iter().enumerate() {
                let at = d.wrapping_add(4 * i * pitch + j);
                // SAFETY: lanes `j..j + m` of planes `4i..4i + 4`: below `15 * pitch + tw`.
                unsafe {
                    _mm512_mask_storeu_ps(at, store, e);
                    _mm512_mask_storeu_ps(at.wrapping_add(pitch), store, _mm512_add_ps(e, o));
                    _mm512_mask_storeu_ps(at.wrapping_add(2 * pitch), store, _mm512_sub_ps(e, o));
                    _mm512_mask_storeu_ps(at.wrapping_add(3 * pitch), store, _mm512_sub_ps(zero, o));
                }
            }
            j += 16;
        }
    }

    /// [`super::Avx512::winograd_output_plane`].
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `h, w > 0`, `out` holds `h * w` floats, and `m` holds
    /// `15 * pitch + tiles` floats with `tiles = ceil(h / 2) * ceil(w / 2) <= pitch`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn winograd_output_plane(
        m: &[f32],
        pitch: usize,
        [h, w]: [usize; 2],
        bias: f32,
        relu: bool,
        out: &mut [std::mem::MaybeUninit<f32>],
    ) {
        let low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        let high = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        let (tw, tiles) = (w.div_ceil(2), h.div_ceil(2) * w.div_ceil(2));
        let (mp, d) = (m.as_ptr(), out.as_mut_ptr().cast::<f32>());
        let (b, zero) = (_mm512_set1_ps(bias), _mm512_setzero_ps());
        let activate = |v: __m512| {
            if relu {
                // `v <= 0` is false for NaN, which passes, as in `relu_in_place`.
                _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, zero), zero)
            } else {
                v
            }
        };
        let mut v = 0;
        while v < tiles {
            let k = lanes((tiles - v).min(16));
            // SAFETY: tiles `v..v + 16` under `k` lie below `tiles <= pitch`, so plane ξ's
            // lanes below `15 * pitch + tiles <= m.len()`; masked-off lanes are not accessed.
            let sum = |xi: usize| unsafe { _mm512_maskz_loadu_ps(k, mp.wrapping_add(xi * pitch + v)) };
            // Down the columns: s[a][col], in the portable loops' order.
            let mut s = [[zero; 4]; 2];
            for col in 0..4 {
                let (m0, m1, m2, m3) = (sum(col), sum(4 + col), sum(8 + col), sum(12 + col));
                s[0][col] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
                s[1][col] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
            }
            for (a, c) in s.iter().enumerate() {
                let y0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c[0], c[1]), c[2]), b);
                let y1 = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(c[1], c[2]), c[3]), b);
                let (y0, y1) = (activate(y0), activate(y1));
                // Lanes 2i and 2i + 1 of half `hf` are tile `v + 8 hf + i`'s two columns.
                let halves = [
                    _mm512_permutex2var_ps(y0, low, y1),
                    _mm512_permutex2var_ps(y0, high, y1),
                ];
                for (hf, outs) in halves.into_iter().enumerate() {
                    let t0 = v + 8 * hf;
                    let end = (t0 + 8).min(tiles);
                    let mut t = t0;
                    // Runs of tiles within one tile row: contiguous outputs in row 2 ty + a.
                    while t < end {
                        let (ty, tx) = (t / tw, t % tw);
                        let run_end = end.min((ty + 1) * tw);
                        let oh = 2 * ty + a;
                        if oh < h {
                            let (first, cols) = (2 * (t - t0), (2 * (run_end - t)).min(w - 2 * tx));
                            let mask = lanes(first + cols) & !lanes(first);
                            // SAFETY: lane `first + i` (i < cols) lands on `oh * w + 2 tx + i`,
                            // inside row `oh < h` as `2 tx + cols <= w`; masked-off lanes are
                            // not accessed.
                            unsafe {
                                let at = d.wrapping_add(oh * w + 2 * tx).wrapping_sub(first);
                                _mm512_mask_storeu_ps(at, mask, outs)
                            };
                        }
                        t = run_end;
                    }
                }
            }
            v += 16;
        }
    }

    /// The floats `s[at..end]` (at most 32) as two vectors, zero from `end` on.
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `s[at..end]` is readable and `end - at <= 32`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn pair(s: *const f32, at: usize, end: usize) -> (__m512, __m512) {
        let need = end - at;
        let (lo, hi) = (lanes(need.min(16)), lanes(need.saturating_sub(16)));
        // SAFETY: the lanes loaded lie below `end` (the caller's bounds); masked-off lanes are
        // not accessed.
        unsafe {
            (
                _mm512_maskz_loadu_ps(lo, s.wrapping_add(at)),
                _mm512_maskz_loadu_ps(hi, s.wrapping_add(at + 16)),
            )
        }
    }

    /// [`super::Avx512::pad_zeros`].
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `h, w > 0`, `x` holds whole `[h, w]` planes and `padded` as many
    /// `[h + 2 * ph, w + 2 * pw]` planes, whose width is at most `PAD_MAX_WIDTH`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pad_zeros(padded: &mut [f32], x: &[f32], [h, w]: [usize; 2], [ph, pw]: [usize; 2]) {
        let (hn, wn) = (h + 2 * ph, w + 2 * pw);
        let chunks = wn.div_ceil(16);
        // Per 16-float chunk `k` of a padded row: the lanes inside the row (stored) and those
        // on an input pixel, `pw <= 16 * k + l < pw + w` (loaded; the others are zeros).
        let mut masks = [(0 as __mmask16, 0 as __mmask16); super::Avx512::PAD_MAX_WIDTH / 16];
        for (k, m) in masks.iter_mut().enumerate().take(chunks) {
            let lane_bits = |end: usize| lanes(end.saturating_sub(16 * k).min(16));
            *m = (lanes((wn - 16 * k).min(16)), lane_bits(pw + w) & !lane_bits(pw));
        }
        let (d, sp) = (padded.as_mut_ptr(), x.as_ptr());
        for c in 0..x.len() / (h * w) {
            for r in 0..hn {
                let row = d.wrapping_add((c * hn + r) * wn);
                // Row `r`'s pixel `p` reads `src[p]` (its input row shifted by `pw`); padding
                // rows read nothing.
                let (src, on) = match r.checked_sub(ph).filter(|&i| i < h) {
                    Some(i) => (sp.wrapping_add((c * h + i) * w).wrapping_sub(pw), true),
                    None => (sp, false),
                };
                for (k, &(store, load)) in masks[..chunks].iter().enumerate() {
                    let load = if on { load } else { 0 };
                    // SAFETY: loaded lanes are pixels `16 * k + l - pw` of input row `i`,
                    // inside `x`; stored lanes are `16 * k + l < wn` of padded row `r`, inside
                    // `padded` (the caller's lengths). Masked-off lanes are not accessed.
                    unsafe {
                        let v = _mm512_maskz_loadu_ps(load, src.wrapping_add(16 * k));
                        _mm512_mask_storeu_ps(row.wrapping_add(16 * k), store, v);
                    }
                }
            }
        }
    }

    /// The `len` floats at `d` = `src` (`len` long).
    ///
    /// # Safety
    /// The CPU runs AVX-512F ([`super::avx512`]); `d` is valid for writes of `len` floats.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn copy_row(d: *mut f32, len: usize, src: &[f32]) {
        assert_eq!(len, src.len(), "copy_row: lengths");
        let s = src.as_ptr();
        let mut i = 0;
        while i < len {
            let k = lanes((len - i).min(16));
            // SAFETY: lanes `i..i + popcount(k)` lie inside both slices; masked-off lanes are
            // neither read nor written.
            unsafe { _mm512_mask_storeu_ps(d.add(i), k, _mm512_maskz_loadu_ps(k, s.add(i))) };
            i += 16;
        }
    }

    /// [`super::Avx512::copy_rows`].
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `width > 0`, `dst.len()` is a multiple of `width`, and `src` holds
    /// `(rows - 1) * pitch + width` floats for `rows = dst.len() / width` (when not 0).
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn copy_rows(dst: &mut [f32], src: &[f32], pitch: usize, width: usize) {
        for r in 0..dst.len() / width {
            let (at, from) = (r * width, r * pitch);
            if width <= 16 && at + 16 <= dst.len() && from + 16 <= src.len() {
                // SAFETY: 16 floats from `at` lie in `dst` and from `from` in `src` (checked
                // just above); the lanes past this row's `width` land on the rows after it,
                // inside `dst`, which are written after it.
                unsafe {
                    _mm512_storeu_ps(dst.as_mut_ptr().add(at), _mm512_loadu_ps(src.as_ptr().add(from)))
                };
            } else {
                // SAFETY: the CPU runs AVX-512F (the caller's bound).
                unsafe { copy_row(dst[at..at + width].as_mut_ptr(), width, &src[from..from + width]) };
            }
        }
    }

    /// `dst += src` (same length).
    ///
    /// # Safety
    /// The CPU runs AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn add_row(dst: &mut [f32], src: &[f32]) {
        assert_eq!(dst.len(), src.len(), "add_row: lengths");
        let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
        let mut i = 0;
        while i < dst.len() {
            let k = lanes((dst.len() - i).min(16));
            // SAFETY: as in `copy_row`.
            unsafe {
                let sum = _mm512_add_ps(
                    _mm512_maskz_loadu_ps(k, d.add(i)),
                    _mm512_maskz_loadu_ps(k, s.add(i)),
                );
                _mm512_mask_storeu_ps(d.add(i), k, sum);
            }
            i += 16;
        }
    }

    /// Lanes `2j` and `2j + 1` of `row[..2n]` (`n` at most 16) as two vectors: the left and
    /// right columns of 16 consecutive 2-wide windows.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn split_pairs(row: &[f32], n: usize) -> (__m512, __m512) {
        assert!(n <= 16 && 2 * n <= row.len(), "split_pairs: row too short");
        let lo_n = (2 * n).min(16);
        let p = row.as_ptr();
        // SAFETY: `2 * n` floats are in `row`; masked-off lanes are not read (the second
        // pointer is formed with `wrapping_add` because it may point past the end then).
        let (lo, hi) = unsafe {
            (
                _mm512_maskz_loadu_ps(lanes(lo_n), p),
                _mm512_maskz_loadu_ps(lanes(2 * n - lo_n), p.wrapping_add(16)),
            )
        };
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        (
            _mm512_permutex2var_ps(lo, even, hi),
            _mm512_permutex2var_ps(lo, odd, hi),
        )
    }

    /// `super::super::pool::pick` on 16 lanes: take `(v, vi)` where `v` is greater or NaN.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn pick(best: (__m512, __m512i), v: __m512, vi: __m512i) -> (__m512, __m512i) {
        let take = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, best.0) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        (
            _mm512_mask_blend_ps(take, best.0, v),
            _mm512_mask_blend_epi32(take, best.1, vi),
        )
    }

    /// One output row of 2x2 stride-2 max pooling: `out[j]`, `argmax[j]` from the windows at
    /// columns `2j, 2j + 1` of `top` and `bottom`, scanned in the portable loop's order;
    /// `base` is `top`'s offset in its plane and `in_w` the plane's row length.
    ///
    /// # Safety
    /// The CPU runs AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pool_2x2_row(
        top: &[f32],
        bottom: &[f32],
        base: u32,
        in_w: u32,
        out: &mut [f32],
        argmax: &mut [u32],
    ) {
        assert_eq!(out.len(), argmax.len(), "pool_2x2_row: lengths");
        let iota2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        for o0 in (0..out.len()).step_by(16) {
            let n = (out.len() - o0).min(16);
            let (tl, tr) = split_pairs(&top[2 * o0..], n);
            let (bl, br) = split_pairs(&bottom[2 * o0..], n);
            let at = _mm512_add_epi32(iota2, _mm512_set1_epi32((base + 2 * o0 as u32) as i32));
            let one = _mm512_set1_epi32(1);
            let below = _mm512_add_epi32(at, _mm512_set1_epi32(in_w as i32));
            let m = pick((tl, at), tr, _mm512_add_epi32(at, one));
            let m = pick(m, bl, below);
            let (best, idx) = pick(m, br, _mm512_add_epi32(below, one));
            // SAFETY: lanes `o0..o0 + n` lie inside `out` and `argmax`.
            unsafe {
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(o0), lanes(n), best);
                _mm512_mask_storeu_epi32(argmax.as_mut_ptr().add(o0).cast(), lanes(n), idx);
            }
        }
    }
}
