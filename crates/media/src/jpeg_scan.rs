//! The exact length check of a sequential JPEG's scans: every scan's
//! Huffman codes are walked, block by block, without decoding a pixel, and
//! the data must end where the last block does (at most the final byte's
//! padding bits after it) and hold a restart marker at every restart
//! interval.
//!
//! *Why:* damage inside the data (random bytes, a splice) throws the
//! decoder off its code boundaries; Huffman codes fall back into step
//! within a few blocks, and the decoder then finishes early, leaving data
//! unread, or late, running into the end. zune-jpeg accepts both, in
//! strict mode too; libjpeg warns about the first ("extraneous bytes
//! before marker"). Walking the codes costs a fraction of a decode (no
//! dequantizing, no transform, no colour).
//!
//! *Why two lookups per table:* the walk needs no coefficient's value, only
//! how many bits each takes. So a code of at most [`FAST_BITS`] bits is
//! looked up together with the extra bits that follow it (its size), and a
//! coefficient costs one lookup and one shift; the buffer is refilled eight
//! bytes at a time when they hold no 0xFF. Anything else (a longer code,
//! the data's end, a marker, a block overrun) takes the step-by-step path,
//! whose judgement is the answer, so both paths refuse the same files with
//! the same message (tested against the step-by-step walk alone).
//!
//! Progressive scans are not walked: their refinement passes need every
//! coefficient's history to know how many bits a block takes. For them
//! the strict decoder and the 1-bit tail of [`mod@crate::jpeg`] stand.

use crate::error::MediaError;

/// A Huffman table as a DHT segment defines it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Huffman {
    /// For a 9-bit prefix: the code's length (1 to 9) in the high byte and
    /// its symbol in the low one; zero when the code is longer.
    lookup: Vec<u16>,
    /// Per length, the largest code of that length (-1: none), the first
    /// code, and the index of its symbol.
    max_code: [i32; 17],
    first_code: [i32; 17],
    first_index: [usize; 17],
    symbols: Vec<u8>,
    /// For a [`FAST_BITS`]-bit prefix, used as a DC table: the code's length
    /// plus its size in the low 6 bits; zero when the code is longer or
    /// its size is not a DC size.
    fast_dc: Box<[u16; 1 << FAST_BITS]>,
    /// The same, used as an AC table: the bits the code and its size take
    /// in the low 6 bits, then how far the coefficient index moves (run + 1,
    /// or 16 for a run of sixteen zeros), or [`END_OF_BLOCK`].
    fast_ac: Box<[u16; 1 << FAST_BITS]>,
}

const LOOKUP_BITS: u32 = 9;

/// Prefix bits of the fast lookups: 2,048 entries (4 KiB) each, so a
/// scan's active tables stay in the L1 cache; longer prefixes measured no
/// faster.
const FAST_BITS: u32 = 11;

/// A fast AC entry's flag for a code that ends the block.
const END_OF_BLOCK: u16 = 1 << 15;

impl Huffman {
    /// From a segment's 16 counts (codes of each length) and its symbols.
    pub fn new(counts: &[u8; 16], symbols: &[u8]) -> Option<Huffman> {
        let mut table = Huffman {
            lookup: vec![0; 1 << LOOKUP_BITS],
            max_code: [-1; 17],
            first_code: [0; 17],
            first_index: [0; 17],
            symbols: symbols.to_vec(),
            fast_dc: Box::new([0; 1 << FAST_BITS]),
            fast_ac: Box::new([0; 1 << FAST_BITS]),
        };
        let (mut code, mut index) = (0_i32, 0_usize);
        for length in 1..=16 {
            let count = i32::from(counts[length - 1]);
            table.first_code[length] = code;
            table.first_index[length] = index;
            if count > 0 {
                table.max_code[length] = code + count - 1;
            }
            for offset in 0..count {
                let symbol = *symbols.get(index + offset as usize)?;
                if length as u32 <= LOOKUP_BITS {
                    let shift = LOOKUP_BITS - length as u32;
                    let start = ((code + offset) as usize) << shift;
                    let entry = ((length as u16) << 8) | u16::from(symbol);
                    table.lookup[start..start + (1 << shift)].fill(entry);
                }
                if length as u32 <= FAST_BITS {
                    let shift = FAST_BITS - length as u32;
                    let start = ((code + offset) as usize) << shift;
                    let range = start..start + (1 << shift);
                    let length = length as u16;
                    if symbol <= 16 {
                        table.fast_dc[range.clone()].fill(length + u16::from(symbol));
                    }
                    let (run, size) = (u16::from(symbol >> 4), u16::from(symbol & 15));
                    table.fast_ac[range].fill(match (run, size) {
                        (15, 0) => length | 16 << 6,
                        (_, 0) => length | END_OF_BLOCK,
                        _ => (length + size) | (run + 1) << 6,
                    });
                }
            }
            code += count;
            index += count as usize;
            // No code may be all 1-bits, so each length leaves one free.
            if code >= 1 << length {
                return None;
            }
            code <<= 1;
        }
        (index == symbols.len()).then_some(table)
    }
}

/// One scan as its header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scan {
    /// Per component in the scan: its index in the frame, then its DC and
    /// AC tables as they stood when the scan began.
    pub components: Vec<(usize, Huffman, Huffman)>,
    /// MCUs between restart markers (0: none).
    pub restart_interval: u32,
    /// Its entropy-coded data, as offsets into the file.
    pub data: std::ops::Range<usize>,
}

/// The fast refill: when the next eight bytes hold no 0xFF (no stuffing,
/// no marker), as many of them as the buffer takes at once.
#[inline(always)]
fn refill_word(data: &[u8], at: &mut usize, buffer: &mut u64, count: &mut u32) -> bool {
    let Some(word) = data.get(*at..*at + 8) else {
        return false;
    };
    if !no_ff(word) {
        return false;
    }
    let word = u64::from_be_bytes(word.try_into().expect("eight bytes"));
    let bytes = (64 - *count) / 8;
    *buffer |= (word >> (64 - 8 * bytes)) << (64 - *count - 8 * bytes);
    *at += bytes as usize;
    *count += 8 * bytes;
    true
}

/// Whether `bytes` (eight) hold no 0xFF: no stuffed byte, no marker.
#[inline(always)]
fn no_ff(bytes: &[u8]) -> bool {
    // A zero byte of the inverted word is a 0xFF of the data.
    let inverted = !u64::from_ne_bytes(bytes.try_into().expect("eight bytes"));
    inverted.wrapping_sub(0x0101_0101_0101_0101) & !inverted & 0x8080_8080_8080_8080 == 0
}

/// Reads bits from entropy-coded data: stuffed zero bytes dropped, and
/// stopping at any marker.
struct Bits<'a> {
    data: &'a [u8],
    at: usize,
    /// Valid bits in the high `count` bits.
    buffer: u64,
    count: u32,
}

impl Bits<'_> {
    /// Tops the buffer up to at least 57 bits, or to the data's end or the
    /// next marker.
    fn fill(&mut self) {
        if self.count > 56 || refill_word(self.data, &mut self.at, &mut self.buffer, &mut self.count) {
            return;
        }
        while self.count <= 56 {
            let Some(&byte) = self.data.get(self.at) else { return };
            if byte == 0xFF {
                if self.data.get(self.at + 1) != Some(&0x00) {
                    return; // a marker
                }
                self.at += 1;
            }
            self.at += 1;
            self.buffer |= u64::from(byte) << (56 - self.count);
            self.count += 8;
        }
    }

    fn consume(&mut self, bits: u32) -> Result<(), Stop> {
        if bits > self.count {
            self.fill();
            if bits > self.count {
                return Err(Stop::End);
            }
        }
        self.buffer <<= bits;
        self.count -= bits;
        Ok(())
    }

    fn symbol(&mut self, table: &Huffman) -> Result<u8, Stop> {
        if self.count < 16 {
            self.fill();
        }
        let peek = (self.buffer >> 48) as i32;
        let entry = table.lookup[(peek >> (16 - LOOKUP_BITS)) as usize];
        let (length, symbol) = if entry != 0 {
            (u32::from(entry >> 8), entry as u8)
        } else {
            let length = (LOOKUP_BITS + 1..=16)
                .find(|&length| (peek >> (16 - length)) <= table.max_code[length as usize])
                .ok_or(Stop::BadCode)?;
            let code = peek >> (16 - length);
            let index = table.first_index[length as usize] + (code - table.first_code[length as usize]) as usize;
            (length, *table.symbols.get(index).ok_or(Stop::BadCode)?)
        };
        self.consume(length)?;
        Ok(symbol)
    }

    /// The fast lookups' index: the next [`FAST_BITS`] bits.
    fn peek_fast(&self) -> usize {
        (self.buffer >> (64 - FAST_BITS)) as usize
    }

    /// Walks AC codes from coefficient `k` while the fast lookup answers:
    /// `None` once the block has ended, else the coefficient where the
    /// step-by-step path takes over. The bit reader lives in locals here,
    /// so the loop keeps it in registers.
    #[inline(always)]
    fn fast_ac(&mut self, ac: &Huffman, mut k: usize) -> Option<usize> {
        let table = &*ac.fast_ac;
        let (data, mut at, mut buffer, mut count) = (self.data, self.at, self.buffer, self.count);
        let stop = loop {
            if count < 32 && !refill_word(data, &mut at, &mut buffer, &mut count) {
                (self.at, self.buffer, self.count) = (at, buffer, count);
                self.fill();
                (at, buffer, count) = (self.at, self.buffer, self.count);
            }
            let entry = table[(buffer >> (64 - FAST_BITS)) as usize];
            let bits = u32::from(entry & 63);
            if entry == 0 || bits > count {
                break Some(k);
            }
            if entry & END_OF_BLOCK != 0 {
                buffer <<= bits;
                count -= bits;
                break None;
            }
            let next = k + usize::from((entry >> 6) & 31);
            if next > 64 {
                break Some(k);
            }
            buffer <<= bits;
            count -= bits;
            k = next;
            if k == 64 {
                break None;
            }
        };
        (self.at, self.buffer, self.count) = (at, buffer, count);
        stop
    }

    /// One block: a DC difference, then AC run/size codes up to the end
    /// of block or the 63rd coefficient. With `FAST`, through the fast
    /// lookups where they answer (see the module documentation).
    fn block<const FAST: bool>(&mut self, dc: &Huffman, ac: &Huffman) -> Result<(), Stop> {
        if self.count < 32 {
            self.fill();
        }
        let entry = if FAST { dc.fast_dc[self.peek_fast()] } else { 0 };
        let bits = u32::from(entry);
        if entry != 0 && bits <= self.count {
            self.buffer <<= bits;
            self.count -= bits;
        } else {
            let size = self.symbol(dc)?;
            if size > 16 {
                return Err(Stop::BadCode);
            }
            self.consume(u32::from(size))?;
        }
        let mut k = 1;
        while k < 64 {
            if FAST {
                match self.fast_ac(ac, k) {
                    None => return Ok(()),
                    Some(at) => k = at,
                }
            }
            let run_size = self.symbol(ac)?;
            let (run, size) = (run_size >> 4, run_size & 15);
            if size == 0 {
                if run != 15 {
                    return Ok(());
                }
                k += 16;
                continue;
            }
            k += usize::from(run);
            if k > 63 {
                return Err(Stop::BadCode);
            }
            self.consume(u32::from(size))?;
            k += 1;
        }
        if k > 64 {
            return Err(Stop::BadCode);
        }
        Ok(())
    }
}

enum Stop {
    End,
    BadCode,
}

/// Checks a sequential scan of a frame of `width` × `height` with
/// `sampling` (per frame component): see the module documentation.
pub(crate) fn check(
    bytes: &[u8],
    scan: &Scan,
    width: u32,
    height: u32,
    sampling: &[(u8, u8)],
) -> Result<(), MediaError> {
    walk::<true>(bytes, scan, width, height, sampling)
}

/// [`check`], through the fast lookups or (`FAST` false) step by step.
pub(crate) fn walk<const FAST: bool>(
    bytes: &[u8],
    scan: &Scan,
    width: u32,
    height: u32,
    sampling: &[(u8, u8)],
) -> Result<(), MediaError> {
    let damaged = |what: String| MediaError::NotAnImage(format!("the JPEG's image data {what}"));
    let h_max = sampling.iter().map(|&(h, _)| u32::from(h)).max().unwrap_or(1);
    let v_max = sampling.iter().map(|&(_, v)| u32::from(v)).max().unwrap_or(1);
    // Blocks per MCU of each component, and how many MCUs.
    let (units, mcus): (Vec<u32>, u64) = if let [(index, _, _)] = scan.components.as_slice() {
        let (h, v) = sampling[*index];
        let columns = (width * u32::from(h)).div_ceil(h_max).div_ceil(8);
        let rows = (height * u32::from(v)).div_ceil(v_max).div_ceil(8);
        (vec![1], u64::from(columns) * u64::from(rows))
    } else {
        let units = scan
            .components
            .iter()
            .map(|(index, _, _)| u32::from(sampling[*index].0) * u32::from(sampling[*index].1))
            .collect();
        (
            units,
            u64::from(width.div_ceil(8 * h_max)) * u64::from(height.div_ceil(8 * v_max)),
        )
    };
    let mut bits = Bits {
        data: &bytes[scan.data.clone()],
        at: 0,
        buffer: 0,
        count: 0,
    };
    let interval = u64::from(scan.restart_interval);
    for mcu in 0..mcus {
        if interval > 0 && mcu > 0 && mcu % interval == 0 {
            let expected = 0xD0 + ((mcu / interval - 1) % 8) as u8;
            if bits.count >= 8 || bits.data.get(bits.at..bits.at + 2) != Some(&[0xFF, expected]) {
                return Err(damaged(format!("lacks its restart marker after MCU {mcu} of {mcus}")));
            }
            bits.at += 2;
            (bits.buffer, bits.count) = (0, 0);
        }
        for ((_, dc, ac), &blocks) in scan.components.iter().zip(&units) {
            for _ in 0..blocks {
                bits.block::<FAST>(dc, ac).map_err(|stop| match stop {
                    Stop::End => damaged(format!(
                        "ends in MCU {mcu} of {mcus}, before its last block (truncated or damaged)"
                    )),
                    Stop::BadCode => damaged(format!("holds an invalid Huffman code in MCU {mcu} (damaged)")),
                })?;
            }
        }
    }
    // Bits left: those buffered and those unread, without the stuffed
    // zero bytes (which the buffer holds none of either).
    let unread = &bits.data[bits.at..];
    let stuffed = unread.windows(2).filter(|pair| *pair == [0xFF, 0x00]).count();
    let left = (unread.len() - stuffed) as u64 * 8 + u64::from(bits.count);
    if left >= 8 {
        return Err(damaged(format!(
            "has {} bytes after its last block (damaged: the blocks end before the data)",
            left / 8
        )));
    }
    Ok(())
}
