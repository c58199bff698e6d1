//! An LZ4 block encoder for a fixed dictionary whose hash table is built once.
//!
//! `lz4_flex::block::compress_with_dict` hashes the whole dictionary again on every call:
//! with the 11.5 KB dictionary of [`super::packed`] that is 3.4 % of the server's CPU
//! under `pairs` (six bodies packed per plan and execute), more than the compression
//! itself. Here the dictionary's table is built once ([`DictTable::new`]); every body
//! looks positions up in it, its own positions layered over it, and nothing is copied but
//! the body. The output is the standard LZ4 block format with the
//! dictionary as the block's prefix, so `lz4_flex`'s decoder reads it unchanged.
//!
//! The algorithm is LZ4's greedy one: hash the next four bytes, look up the last position
//! with that hash, take the match if the bytes agree, extend it both ways, emit the
//! literals before it and the match, go on after it. The format's end rules are kept: the
//! last five bytes are literals, and no match starts within the last twelve.

use std::cell::RefCell;

const HASH_LOG: u32 = 12;
const TABLE_LEN: usize = 1 << HASH_LOG;
const MIN_MATCH: usize = 4;
/// No match starts within this many bytes of the block's end.
const MF_LIMIT: usize = 12;
/// The block always ends with at least this many literals.
const LAST_LITERALS: usize = 5;

/// Positions are 16-bit: the dictionary and the body together stay below 64 KB.
pub(super) const MAX_WINDOW: usize = u16::MAX as usize;

/// A dictionary and the hash table of its positions.
pub(super) struct DictTable {
    dict: &'static [u8],
    table: Box<[u16; TABLE_LEN]>,
}

fn hash(v: u32) -> usize {
    (v.wrapping_mul(2_654_435_761) >> (32 - HASH_LOG)) as usize
}

fn read_u32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

impl DictTable {
    /// Hashes every third position of `dict`, as LZ4's reference encoder does (hashing
    /// every position makes the typical bodies 6 % larger, later positions shadowing
    /// better matches).
    pub(super) fn new(dict: &'static [u8]) -> Self {
        assert!(dict.len() < MAX_WINDOW, "an LZ4 dictionary is below 64 KB");
        let mut table = Box::new([0u16; TABLE_LEN]);
        for i in (0..dict.len().saturating_sub(MIN_MATCH - 1)).step_by(3) {
            table[hash(read_u32(dict, i))] = i as u16;
        }
        DictTable { dict, table }
    }

    /// `input` as an LZ4 block against the dictionary, or `None` if the dictionary and
    /// `input` together do not fit 16-bit positions.
    pub(super) fn compress(&self, input: &[u8]) -> Option<Vec<u8>> {
        let start = self.dict.len();
        if start + input.len() > MAX_WINDOW {
            return None;
        }
        thread_local! {
            static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
                dict: std::ptr::null(),
                buf: Vec::new(),
                own: Box::new([0; TABLE_LEN]),
                generation: 0,
            });
        }
        Some(SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            // The buffer keeps the dictionary from the last call (its bytes are 'static
            // and never change); only the body is copied in.
            if s.dict != self.dict.as_ptr() || s.buf.len() < start {
                s.buf.clear();
                s.buf.extend_from_slice(self.dict);
                s.dict = self.dict.as_ptr();
            }
            s.buf.truncate(start);
            s.buf.extend_from_slice(input);
            s.generation += 1;
            if s.generation > u16::MAX as u32 {
                s.own.fill(0);
                s.generation = 1;
            }
            let mut table = Positions {
                dict: &self.table,
                own: &mut s.own,
                generation: s.generation,
            };
            encode(&s.buf, start, &mut table)
        }))
    }
}

/// A thread's buffer (the dictionary, then the body) and table of the body's positions.
struct Scratch {
    dict: *const u8,
    buf: Vec<u8>,
    own: Box<[u32; TABLE_LEN]>,
    generation: u32,
}

/// The last position seen for each hash: the body's own (entries stamped with this
/// call's generation) over the dictionary's, so no call copies the dictionary's table.
struct Positions<'a> {
    dict: &'a [u16; TABLE_LEN],
    own: &'a mut [u32; TABLE_LEN],
    generation: u32,
}

impl Positions<'_> {
    fn get(&self, h: usize) -> usize {
        let e = self.own[h];
        if e >> 16 == self.generation {
            (e & 0xFFFF) as usize
        } else {
            self.dict[h] as usize
        }
    }

    fn set(&mut self, h: usize, pos: usize) {
        self.own[h] = (self.generation << 16) | pos as u32;
    }
}

/// Encodes `buf[start..]` as one LZ4 block whose matches may reach back into
/// `buf[..start]` (the dictionary), `table` starting with the dictionary's positions.
fn encode(buf: &[u8], start: usize, table: &mut Positions<'_>) -> Vec<u8> {
    let end = buf.len();
    let mut out = Vec::with_capacity(16 + (end - start) / 2);
    let mut anchor = start;
    let mut i = start;
    // A match may start at `i` only while at least MF_LIMIT bytes follow it, and it must
    // end LAST_LITERALS bytes before the end.
    while i + MF_LIMIT < end {
        let v = read_u32(buf, i);
        let h = hash(v);
        let mut cand = table.get(h);
        table.set(h, i);
        if cand >= i || read_u32(buf, cand) != v {
            // LZ4's acceleration: the longer no match is found, the larger the step.
            i += 1 + ((i - anchor) >> 6);
            continue;
        }
        let mut at = i;
        while at > anchor && cand > 0 && buf[at - 1] == buf[cand - 1] {
            at -= 1;
            cand -= 1;
        }
        let limit = end - LAST_LITERALS;
        let mut len = MIN_MATCH + (i - at);
        while at + len < limit && buf[cand + len] == buf[at + len] {
            len += 1;
        }
        sequence(&mut out, &buf[anchor..at], (at - cand) as u16, len);
        i = at + len;
        anchor = i;
        if i + MF_LIMIT < end {
            // The position just before the next one, as the reference encoder does.
            table.set(hash(read_u32(buf, i - 2)), i - 2);
        }
    }
    last_literals(&mut out, &buf[anchor..]);
    out
}

/// One sequence: the literals, then a match of `len` bytes `offset` back.
fn sequence(out: &mut Vec<u8>, literals: &[u8], offset: u16, len: usize) {
    let (lit, ml) = (literals.len(), len - MIN_MATCH);
    out.push(((lit.min(15) as u8) << 4) | ml.min(15) as u8);
    if lit >= 15 {
        length(out, lit - 15);
    }
    out.extend_from_slice(literals);
    out.extend_from_slice(&offset.to_le_bytes());
    if ml >= 15 {
        length(out, ml - 15);
    }
}

/// The block's last sequence: literals only.
fn last_literals(out: &mut Vec<u8>, literals: &[u8]) {
    let lit = literals.len();
    out.push((lit.min(15) as u8) << 4);
    if lit >= 15 {
        length(out, lit - 15);
    }
    out.extend_from_slice(literals);
}

/// A length's continuation bytes: 255 while it lasts, then the rest.
fn length(out: &mut Vec<u8>, mut n: usize) {
    while n >= 255 {
        out.push(255);
        n -= 255;
    }
    out.push(n as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DICT: &[u8] = include_bytes!("body-dict-1.txt");

    fn table() -> &'static DictTable {
        static T: std::sync::LazyLock<DictTable> =
            std::sync::LazyLock::new(|| DictTable::new(DICT));
        &T
    }

    fn round_trip(input: &[u8]) -> Vec<u8> {
        let block = table().compress(input).expect("fits");
        let mut out = vec![0u8; input.len()];
        let n = lz4_flex::block::decompress_into_with_dict(&block, &mut out, DICT)
            .unwrap_or_else(|e| panic!("lz4_flex cannot read our block of {input:?}: {e}"));
        assert_eq!(n, input.len());
        assert_eq!(out, input);
        block
    }

    #[test]
    fn edge_cases_read_back_with_lz4_flex() {
        let long_run = vec![b'a'; 5000];
        let mut literals = Vec::new();
        for i in 0..3000u32 {
            literals.extend_from_slice(&i.wrapping_mul(2_654_435_761).to_le_bytes());
        }
        let cases: Vec<Vec<u8>> = vec![
            vec![],
            b"a".to_vec(),
            b"{\"status\":\"q".to_vec(),  // 12 bytes: literals only
            b"{\"status\":\"qu".to_vec(), // 13 bytes: the first that may hold a match
            b"{\"status\":\"queued\"}".to_vec(),
            long_run,                           // a match overlapping itself (offset 1)
            literals,                           // literals longer than 255, no match
            DICT[DICT.len() - 3000..].to_vec(), // one long match into the dictionary
            [&DICT[..700], &b"xyz"[..], &DICT[5000..6000]].concat(),
        ];
        for c in &cases {
            round_trip(c);
        }
    }

    #[test]
    fn positions_of_earlier_bodies_are_never_used() {
        // Each call's own positions are stamped with its generation; after 65,535 calls
        // the stamps start again from a cleared table. Bodies on either side of the wrap,
        // each unlike the one before, read back.
        for n in 0..66_000u32 {
            let body = format!("{{\"n\":{n},\"status\":\"queued\",\"pad\":\"{}\"}}", n % 97);
            if n % 5_000 == 0 || (65_530..65_540).contains(&n) {
                round_trip(body.as_bytes());
            } else {
                table().compress(body.as_bytes()).expect("fits");
            }
        }
    }

    #[test]
    fn bodies_up_to_the_16_bit_limit_read_back_and_longer_are_refused() {
        round_trip(&vec![b'x'; MAX_WINDOW - DICT.len()]);
        // The longest body: a filler of high bytes that matches only itself (so the
        // encoder never speeds up past the end), then the dictionary's first 300 bytes, a
        // match whose offset reaches back almost 64 KB.
        let mut far: Vec<u8> = (0..MAX_WINDOW - DICT.len() - 320)
            .map(|i| 0x80 + (i % 127) as u8)
            .collect();
        far.extend_from_slice(&DICT[..300]);
        far.extend_from_slice(&[b'}'; 20]);
        let block = round_trip(&far);
        // The filler: 127 literals and one long match (a byte per 255 of its length).
        // With the far match the rest takes a few bytes; without it, 300 literals.
        let filler = 127 + far.len() / 255;
        assert!(block.len() < filler + 100, "{} bytes", block.len());
        assert!(table()
            .compress(&vec![b'x'; MAX_WINDOW - DICT.len() + 1])
            .is_none());
    }

    #[test]
    fn compresses_the_typical_bodies_as_well_as_lz4_flex() {
        // The dictionary's own lines stand for the bodies the adapter writes.
        let (mut ours, mut theirs, mut raw) = (0, 0, 0);
        for line in DICT.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            // A body like the line, not the line itself (which would be one match).
            let body = String::from_utf8_lossy(line)
                .replace("01m84", "01m99")
                .replace("ACC-1", "ACC-7")
                .replace("1795446", "1795999");
            ours += round_trip(body.as_bytes()).len();
            theirs += lz4_flex::block::compress_with_dict(body.as_bytes(), DICT).len();
            raw += body.len();
        }
        assert!(ours * 4 < raw, "{ours} of {raw} bytes");
        assert!(
            ours <= theirs + theirs / 20,
            "ours {ours}, lz4_flex {theirs}"
        );
    }

    proptest! {
        #[test]
        fn any_bytes_read_back(input in proptest::collection::vec(any::<u8>(), 0..3000)) {
            round_trip(&input);
        }

        #[test]
        fn pieces_of_the_dictionary_read_back(
            pieces in proptest::collection::vec((0..DICT.len(), 0usize..400, any::<u8>()), 0..40)
        ) {
            // Bodies made of dictionary fragments and stray bytes: many matches, some
            // overlapping the body's own earlier text.
            let mut input = Vec::new();
            for (at, len, stray) in pieces {
                input.extend_from_slice(&DICT[at..(at + len).min(DICT.len())]);
                input.push(stray);
            }
            round_trip(&input);
        }
    }
}
