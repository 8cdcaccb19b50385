//! How a ring all-reduce cuts its buffer and which segment each step
//! sends and receives; how values land and travel in `bf16`.

use kindling_schemas::ring::Kind;

use super::{PART_BYTES, PART_VALUES};

/// One ring step: the segment sent, the segment received, and how it lands.
pub(super) struct Step {
    pub(super) send: usize,
    pub(super) recv: usize,
    pub(super) combine: Combine,
}

/// The steps of rank `r`'s all-reduce over `w` ranks, by segment (two ranks
/// swap their one segment, the whole buffer).
pub(super) fn plan(w: usize, r: usize) -> Vec<Step> {
    if w == 2 {
        return vec![Step {
            send: 0,
            recv: 0,
            combine: Combine::Add,
        }];
    }
    // Reduce-scatter: after step s, segment (r - s - 1) holds s + 2 contributions.
    let reduce = (0..w - 1).map(|s| Step {
        send: (r + w - s) % w,
        recv: (r + w - s - 1) % w,
        combine: Combine::Add,
    });
    // All-gather: rank r owns the full sum of segment r + 1; pass them round.
    let gather = (0..w - 1).map(|s| Step {
        send: (r + 1 + w - s) % w,
        recv: (r + w - s) % w,
        combine: Combine::Replace,
    });
    reduce.chain(gather).collect()
}

/// One part of a segment: its length, and its values, locked by whichever
/// of the ring's writer and reader is using them.
pub(super) struct Part<'a> {
    pub(super) len: usize,
    pub(super) values: tokio::sync::Mutex<&'a mut [f32]>,
}

/// `buf` cut into `segments` near-equal segments, each into parts of at
/// most [`PART_VALUES`] (an empty segment still travels as one empty part).
pub(super) fn pieces(buf: &mut [f32], segments: usize) -> Vec<Vec<Part<'_>>> {
    let len = buf.len();
    let mut rest = buf;
    (0..segments)
        .map(|i| {
            let seg_len = len * (i + 1) / segments - len * i / segments;
            let (mut seg, tail) = std::mem::take(&mut rest).split_at_mut(seg_len);
            rest = tail;
            let n = seg_len.div_ceil(PART_VALUES).max(1);
            (0..n)
                .map(|_| {
                    let take = PART_VALUES.min(seg.len());
                    let (part, after) = std::mem::take(&mut seg).split_at_mut(take);
                    seg = after;
                    Part {
                        len: part.len(),
                        values: tokio::sync::Mutex::new(part),
                    }
                })
                .collect()
        })
        .collect()
}

pub(super) fn byte_parts(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let n = data.len().div_ceil(PART_BYTES).max(1);
    (0..n).map(move |p| &data[(p * PART_BYTES).min(data.len())..((p + 1) * PART_BYTES).min(data.len())])
}

/// How a received part lands in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Combine {
    Add,
    Replace,
}

/// Writes `values` as `bf16` into `out`.
pub(super) fn encode_bf16(values: &[f32], out: &mut [f32]) {
    let out = &mut bytemuck::cast_slice_mut::<f32, u16>(out)[..values.len()];
    out.iter_mut().zip(values).for_each(|(o, &v)| *o = f32_to_bf16(v));
}

/// Adds a received part to (or writes it over) `dst`.
pub(super) fn combine(how: Combine, kind: Kind, dst: &mut [f32], received: &[f32]) {
    match (kind, how) {
        (Kind::Bf16, how) => {
            let src = &bytemuck::cast_slice::<f32, u16>(received)[..dst.len()];
            let src = src.iter().map(|&b| bf16_to_f32(b));
            match how {
                Combine::Add => dst.iter_mut().zip(src).for_each(|(d, v)| *d += v),
                Combine::Replace => dst.iter_mut().zip(src).for_each(|(d, v)| *d = v),
            }
        }
        (_, Combine::Add) => dst.iter_mut().zip(received).for_each(|(d, v)| *d += v),
        (_, Combine::Replace) => dst.copy_from_slice(&received[..dst.len()]),
    }
}

/// `x` rounded to `bf16` (nearest, ties to even; NaN stays NaN).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7FFF + ((bits >> 16) & 1);
    ((bits + round) >> 16) as u16
}

/// The `f32` a `bf16` stands for (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_specials() {
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0)), 1.0);
        // 1 + 2^-8 is halfway between two bf16s: ties go to the even one (1.0).
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 2f32.powi(-8))), 1.0);
        assert_eq!(
            bf16_to_f32(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8))),
            1.0 + 2f32.powi(-6)
        );
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(f32_to_bf16(f32::INFINITY)), f32::INFINITY);
        assert_eq!(bf16_to_f32(f32_to_bf16(f32::MAX)), f32::INFINITY);
        assert_eq!(bf16_to_f32(f32_to_bf16(-0.0)).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn each_step_sends_what_the_one_before_received() {
        for w in [3, 4, 5] {
            for r in 0..w {
                let steps = plan(w, r);
                assert_eq!(steps.len(), 2 * (w - 1));
                for s in 1..steps.len() {
                    assert_eq!(steps[s].send, steps[s - 1].recv);
                }
                // Reduce-scatter receives every segment but this rank's own
                // once; all-gather every segment but the one it owns.
                let mut got: Vec<usize> = steps[..w - 1].iter().map(|s| s.recv).collect();
                got.sort();
                assert_eq!(got, (0..w).filter(|&i| i != r).collect::<Vec<_>>());
                assert!(steps[w - 1..].iter().all(|s| s.recv != (r + 1) % w));
            }
        }
        for (len, segments) in [(0, 3), (7, 3), (PART_VALUES * 3 + 1, 2)] {
            let mut buf = vec![0f32; len];
            let pieces = pieces(&mut buf, segments);
            assert_eq!(pieces.len(), segments);
            let total: usize = pieces.iter().flatten().map(|p| p.len).sum();
            assert_eq!(total, len);
            assert!(pieces.iter().all(|s| !s.is_empty()));
        }
    }
}
