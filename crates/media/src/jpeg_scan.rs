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
}

const LOOKUP_BITS: u32 = 9;

impl Huffman {
    /// From a segment's 16 counts (codes of each length) and its symbols.
    pub fn new(counts: &[u8; 16], symbols: &[u8]) -> Option<Huffman> {
        let mut table = Huffman {
            lookup: vec![0; 1 << LOOKUP_BITS],
            max_code: [-1; 17],
            first_code: [0; 17],
            first_index: [0; 17],
            symbols: symbols.to_vec(),
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
    fn fill(&mut self) {
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

    /// One block: a DC difference, then AC run/size codes up to the end
    /// of block or the 63rd coefficient.
    fn block(&mut self, dc: &Huffman, ac: &Huffman) -> Result<(), Stop> {
        let size = self.symbol(dc)?;
        if size > 16 {
            return Err(Stop::BadCode);
        }
        self.consume(u32::from(size))?;
        let mut k = 1;
        while k < 64 {
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
                bits.block(dc, ac).map_err(|stop| match stop {
                    Stop::End => damaged(format!(
                        "ends in MCU {mcu} of {mcus}, before its last block (truncated or damaged)"
                    )),
                    Stop::BadCode => damaged(format!("holds an invalid Huffman code in MCU {mcu} (damaged)")),
                })?;
            }
        }
    }
    let left = (bits.data.len() - bits.at) as u64 * 8 + u64::from(bits.count);
    if left >= 8 {
        return Err(damaged(format!(
            "has {} bytes after its last block (damaged: the blocks end before the data)",
            left / 8
        )));
    }
    Ok(())
}
