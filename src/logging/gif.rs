//! Animated GIF encoding, for evaluation videos: one palette of 255 colours for the whole
//! video (median cut over every frame's colours at 5 bits a channel), LZW-compressed frames,
//! looping forever. A pixel that keeps its colour from the frame before is written as the
//! transparent index, so a still background costs next to nothing. GIF is what TensorBoard
//! shows as a moving image and W&B accepts as a file, and it needs no codec library.
use std::collections::HashMap;

use envs::Frame;

use crate::error::{Error, Result};

/// Colours at 5 bits a channel: the histogram's bins.
const BINS: usize = 1 << 15;
const PALETTE: usize = 256;
/// The index that leaves the frame before showing through; the other 255 are colours.
const UNCHANGED: u8 = 255;
/// LZW codes for 8-bit pixels: 256 literals, then clear and end of information.
const MIN_CODE_SIZE: u8 = 8;
const CLEAR: u16 = 256;
const END: u16 = 257;
const MAX_CODES: u16 = 4096;

/// Each frame's delay in centiseconds at `fps`: frame k ends at round(100·(k+1)/fps), at least
/// 1 cs a frame (players show 0 as their own default).
fn delays(fps: u32) -> impl Iterator<Item = u16> {
    let fps = u64::from(fps.max(1));
    let end = move |k: u64| (100 * k + fps / 2) / fps;
    (0u64..).map(move |k| (end(k + 1) - end(k)).max(1) as u16)
}

/// `frames` (all of one size) as a GIF that shows `fps` frames a second: GIF counts delays in
/// centiseconds, so each frame's is rounded with the rest carried to the next (15 fps: 7, 6, 7
/// centiseconds, repeated), and the whole plays as long as the episode's frames at `fps`.
pub fn encode(frames: &[Frame], fps: u32) -> Result<Vec<u8>> {
    let first = frames
        .first()
        .ok_or_else(|| Error::Other("a video needs at least one frame".into()))?;
    let (width, height) = (first.width, first.height);
    if let Some(other) = frames
        .iter()
        .find(|f| (f.width, f.height) != (width, height) || f.rgb.len() != width * height * 3)
    {
        return Err(Error::Other(format!(
            "video frames of different sizes: {width}x{height} and {}x{} ({} bytes)",
            other.width,
            other.height,
            other.rgb.len()
        )));
    }
    let (Ok(w16), Ok(h16)) = (u16::try_from(width), u16::try_from(height)) else {
        return Err(Error::Other(format!(
            "a {width}x{height} frame is larger than GIF allows (65535)"
        )));
    };
    let palette = Palette::fitted(frames);

    let mut out = Vec::with_capacity(frames.len() * width * height / 4);
    out.extend_from_slice(b"GIF89a");
    out.extend_from_slice(&w16.to_le_bytes());
    out.extend_from_slice(&h16.to_le_bytes());
    // A global colour table of 2^(7+1) entries, 8 bits of colour resolution.
    out.extend_from_slice(&[0xf7, 0, 0]);
    for colour in &palette.colours {
        out.extend_from_slice(colour);
    }
    // NETSCAPE2.0: loop forever.
    out.extend_from_slice(&[0x21, 0xff, 0x0b]);
    out.extend_from_slice(b"NETSCAPE2.0");
    out.extend_from_slice(&[0x03, 0x01, 0x00, 0x00, 0x00]);
    let mut shown = vec![UNCHANGED; width * height];
    let mut indices = vec![0u8; width * height];
    for (frame, delay) in frames.iter().zip(delays(fps)) {
        // Graphic control: keep the frame in place (what it leaves transparent shows the one
        // before), `delay` centiseconds.
        out.extend_from_slice(&[0x21, 0xf9, 0x04, 0x05]);
        out.extend_from_slice(&delay.to_le_bytes());
        out.extend_from_slice(&[UNCHANGED, 0x00]);
        out.push(0x2c);
        out.extend_from_slice(&[0, 0, 0, 0]);
        out.extend_from_slice(&w16.to_le_bytes());
        out.extend_from_slice(&h16.to_le_bytes());
        out.push(0x00);
        for ((index, before), pixel) in indices
            .iter_mut()
            .zip(&mut shown)
            .zip(frame.rgb.chunks_exact(3))
        {
            let colour = palette.lookup[bin(pixel)];
            *index = if colour == *before { UNCHANGED } else { colour };
            *before = colour;
        }
        out.push(MIN_CODE_SIZE);
        for block in lzw(&indices).chunks(255) {
            out.push(block.len() as u8);
            out.extend_from_slice(block);
        }
        out.push(0x00);
    }
    out.push(0x3b);
    Ok(out)
}

fn bin(pixel: &[u8]) -> usize {
    (usize::from(pixel[0] >> 3) << 10)
        | (usize::from(pixel[1] >> 3) << 5)
        | usize::from(pixel[2] >> 3)
}

fn channel(bin: usize, c: usize) -> usize {
    (bin >> (10 - 5 * c)) & 31
}

struct Palette {
    colours: Vec<[u8; 3]>,
    /// The palette index of each histogram bin.
    lookup: Vec<u8>,
}

impl Palette {
    /// Median cut: the box of colours with the widest channel range is split at its
    /// pixel-weighted median until there are 255 boxes; each box's colour is its weighted mean.
    fn fitted(frames: &[Frame]) -> Palette {
        let mut counts = vec![0u64; BINS];
        for frame in frames {
            for pixel in frame.rgb.chunks_exact(3) {
                counts[bin(pixel)] += 1;
            }
        }
        let used: Vec<usize> = (0..BINS).filter(|&b| counts[b] > 0).collect();
        let mut boxes = vec![used];
        while boxes.len() < usize::from(UNCHANGED) {
            let widest = boxes
                .iter()
                .enumerate()
                .filter(|(_, b)| b.len() > 1)
                .map(|(i, b)| {
                    let (c, range) = widest_channel(b);
                    (range, i, c)
                })
                .max();
            let Some((_, i, c)) = widest else { break };
            let mut colours = std::mem::take(&mut boxes[i]);
            colours.sort_unstable_by_key(|&b| channel(b, c));
            let total: u64 = colours.iter().map(|&b| counts[b]).sum();
            let mut seen = 0;
            let mut cut = 1;
            for (k, &b) in colours.iter().enumerate() {
                seen += counts[b];
                if 2 * seen >= total {
                    cut = k + 1;
                    break;
                }
            }
            let cut = cut.clamp(1, colours.len() - 1);
            boxes[i] = colours.split_off(cut);
            boxes.push(colours);
        }
        let mut colours: Vec<[u8; 3]> = boxes
            .iter()
            .map(|b| {
                let total = b.iter().map(|&x| counts[x]).sum::<u64>().max(1);
                let mean = |c: usize| {
                    let sum: u64 = b.iter().map(|&x| counts[x] * channel(x, c) as u64).sum();
                    ((sum * 8 + total * 4) / total).min(255) as u8
                };
                [mean(0), mean(1), mean(2)]
            })
            .collect();
        colours.resize(PALETTE, [0, 0, 0]);
        let lookup = (0..BINS)
            .map(|b| nearest(&colours[..boxes.len().max(1)], b))
            .collect();
        Palette { colours, lookup }
    }
}

/// The channel of the widest range among `colours`, and that range.
fn widest_channel(colours: &[usize]) -> (usize, usize) {
    (0..3)
        .map(|c| {
            let values = colours.iter().map(|&b| channel(b, c));
            let (lo, hi) = values.fold((31, 0), |(lo, hi), v| (lo.min(v), hi.max(v)));
            (c, hi - lo)
        })
        .max_by_key(|&(c, range)| (range, std::cmp::Reverse(c)))
        .unwrap_or((0, 0))
}

fn nearest(colours: &[[u8; 3]], bin: usize) -> u8 {
    let centre = |c: usize| (channel(bin, c) * 8 + 4) as i32;
    let distance = |colour: &[u8; 3]| -> i32 {
        (0..3)
            .map(|c| (i32::from(colour[c]) - centre(c)).pow(2))
            .sum()
    };
    (0..colours.len())
        .min_by_key(|&i| distance(&colours[i]))
        .unwrap_or(0) as u8
}

/// GIF's variable-width LZW over 8-bit indices, packed least significant bit first.
fn lzw(indices: &[u8]) -> Vec<u8> {
    let mut out = Bits::default();
    let mut table: HashMap<u32, u16> = HashMap::with_capacity(usize::from(MAX_CODES));
    let mut width = u32::from(MIN_CODE_SIZE) + 1;
    let mut next = END + 1;
    out.put(CLEAR, width);
    let Some((&first, rest)) = indices.split_first() else {
        out.put(END, width);
        return out.finish();
    };
    let mut current = u16::from(first);
    for &index in rest {
        let key = (u32::from(current) << 8) | u32::from(index);
        if let Some(&code) = table.get(&key) {
            current = code;
            continue;
        }
        out.put(current, width);
        if next < MAX_CODES {
            table.insert(key, next);
            next += 1;
            // The decoder adds each entry one code later: widen once it would overflow.
            if u32::from(next) > 1 << width {
                width += 1;
            }
        } else {
            out.put(CLEAR, width);
            table.clear();
            width = u32::from(MIN_CODE_SIZE) + 1;
            next = END + 1;
        }
        current = u16::from(index);
    }
    out.put(current, width);
    // The decoder adds an entry on reading that last code too, and widens if it fills the
    // width: the end code must be read at the width it then has.
    if u32::from(next) == 1 << width && width < 12 {
        width += 1;
    }
    out.put(END, width);
    out.finish()
}

#[derive(Default)]
struct Bits {
    bytes: Vec<u8>,
    pending: u32,
    count: u32,
}

impl Bits {
    fn put(&mut self, code: u16, width: u32) {
        self.pending |= u32::from(code) << self.count;
        self.count += width;
        while self.count >= 8 {
            self.bytes.push(self.pending as u8);
            self.pending >>= 8;
            self.count -= 8;
        }
    }

    fn finish(mut self) -> Vec<u8> {
        if self.count > 0 {
            self.bytes.push(self.pending as u8);
        }
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GIF's LZW decoder, as a reader would run it.
    fn unlzw(bytes: &[u8]) -> Vec<u8> {
        let (mut pos, mut width) = (0usize, 9u32);
        let mut read = |width: u32| -> u16 {
            let mut code = 0u32;
            for i in 0..width {
                let bit = (bytes[(pos + i as usize) / 8] >> ((pos + i as usize) % 8)) & 1;
                code |= u32::from(bit) << i;
            }
            pos += width as usize;
            code as u16
        };
        let mut table: Vec<Vec<u8>> = Vec::new();
        let mut out = Vec::new();
        let mut previous: Option<Vec<u8>> = None;
        loop {
            let code = read(width);
            if code == CLEAR {
                table = (0..=255u8).map(|b| vec![b]).collect();
                table.extend([vec![], vec![]]);
                width = 9;
                previous = None;
                continue;
            }
            if code == END {
                return out;
            }
            let entry = match table.get(usize::from(code)) {
                Some(e) => e.clone(),
                None => {
                    let p = previous
                        .clone()
                        .expect("a code past the table follows another");
                    let mut e = p.clone();
                    e.push(p[0]);
                    e
                }
            };
            if let Some(mut p) = previous.take() {
                if table.len() < usize::from(MAX_CODES) {
                    p.push(entry[0]);
                    table.push(p);
                    if table.len() == 1 << width && width < 12 {
                        width += 1;
                    }
                }
            }
            out.extend_from_slice(&entry);
            previous = Some(entry);
        }
    }

    /// Frame k ends at round(100·(k+1)/fps) centiseconds: 15 fps plays 15 frames a second
    /// exactly (7, 6, 7, …), not 14.3 with every delay rounded to 7.
    #[test]
    fn delays_carry_their_rounding() {
        let first: Vec<u16> = delays(15).take(6).collect();
        assert_eq!(first, [7, 6, 7, 7, 6, 7]);
        let second: u32 = delays(15).take(15).map(u32::from).sum();
        assert_eq!(second, 100, "15 frames are one second");
        assert!(delays(1000).take(50).all(|d| d >= 1), "no frame of 0 cs");
        assert_eq!(delays(0).next(), Some(100));
    }

    #[test]
    fn lzw_round_trips_through_table_resets() {
        let mut state = 12345u32;
        let mut noise = || {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (state >> 16) as u8
        };
        // Runs (long codes), noise (a table that fills and clears) and a constant tail.
        let mut indices: Vec<u8> = (0..5000).map(|i| (i / 37) as u8).collect();
        indices.extend((0..40_000).map(|_| noise()));
        indices.extend(std::iter::repeat_n(7, 3000));
        assert_eq!(unlzw(&lzw(&indices)), indices);
        assert_eq!(unlzw(&lzw(&[])), Vec::<u8>::new());
        assert_eq!(unlzw(&lzw(&[9])), vec![9]);
        // Every length up to past the first widenings: streams that end exactly where the
        // decoder widens (its table at 512 or 1024 entries) included.
        let noise: Vec<u8> = (0..1500).map(|_| noise()).collect();
        for n in 0..noise.len() {
            assert_eq!(unlzw(&lzw(&noise[..n])), &noise[..n], "{n} indices");
        }
    }

    #[test]
    fn few_colours_are_kept_exactly() {
        let colours = [[0u8, 0, 0], [255, 255, 255], [200, 16, 40], [8, 128, 248]];
        let frame = Frame {
            height: 4,
            width: 4,
            rgb: (0..16).flat_map(|i| colours[i % 4]).collect(),
        };
        let palette = Palette::fitted(std::slice::from_ref(&frame));
        for pixel in frame.rgb.chunks_exact(3) {
            let got = palette.colours[usize::from(palette.lookup[bin(pixel)])];
            // A colour comes back as its 5-bit bin's centre.
            for c in 0..3 {
                assert!(got[c].abs_diff(pixel[c]) <= 4, "{pixel:?} -> {got:?}");
            }
        }
    }

    #[test]
    fn frames_of_different_sizes_are_refused() {
        let frame = |side: usize| Frame {
            height: side,
            width: side,
            rgb: vec![0; side * side * 3],
        };
        let err = encode(&[frame(2), frame(3)], 15).unwrap_err().to_string();
        assert!(err.contains("2x2") && err.contains("3x3"), "{err}");
        assert!(encode(&[], 15).is_err());
        let gif = encode(&[frame(2)], 15).unwrap();
        assert_eq!((&gif[..6], gif.last()), (&b"GIF89a"[..], Some(&0x3b)));
    }
}
