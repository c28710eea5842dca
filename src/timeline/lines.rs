//! Lines of a reader, each at most a limit long: a longer line is skipped without being held.

use std::io::{self, BufRead};

/// One line as read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line<'a> {
    /// The line, without its line break (and without a CR before it).
    Text(&'a [u8]),
    /// A line longer than the limit, and how long it was: skipped.
    TooLong(u64),
}

/// Calls `each` with every line of `reader` and its 1-based number. A line longer than `max`
/// bytes is discarded as it is read (like tokio-util's `LinesCodec`), so memory stays at the
/// reader's buffer plus `max`, however long a line is. A last line without a line break counts.
///
/// # Errors
///
/// The reader's errors (`Interrupted` is retried); lines read before one were passed on.
pub(super) fn each_line<R: BufRead>(
    mut reader: R,
    max: usize,
    mut each: impl FnMut(u64, Line<'_>),
) -> io::Result<()> {
    let mut pending: Vec<u8> = Vec::new(); // the start of a line split across reads
    let mut discarding: Option<u64> = None; // the length so far of an over-long line
    let mut number: u64 = 0;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if chunk.is_empty() {
            if let Some(length) = discarding {
                number = number.saturating_add(1);
                each(number, Line::TooLong(length));
            } else if !pending.is_empty() {
                number = number.saturating_add(1);
                each(number, Line::Text(trim_cr(&pending)));
            }
            return Ok(());
        }
        let used = match newline(chunk) {
            Some(at) => {
                number = number.saturating_add(1);
                let part = &chunk[..at];
                if let Some(length) = discarding.take() {
                    each(number, Line::TooLong(length.saturating_add(at as u64)));
                } else if pending.len() + part.len() > max {
                    each(number, Line::TooLong((pending.len() + part.len()) as u64));
                    pending.clear();
                } else if pending.is_empty() {
                    each(number, Line::Text(trim_cr(part)));
                } else {
                    pending.extend_from_slice(part);
                    each(number, Line::Text(trim_cr(&pending)));
                    pending.clear();
                }
                at + 1
            }
            None => {
                if let Some(length) = &mut discarding {
                    *length = length.saturating_add(chunk.len() as u64);
                } else if pending.len() + chunk.len() > max {
                    discarding = Some((pending.len() + chunk.len()) as u64);
                    pending = Vec::new(); // give the memory back
                } else {
                    pending.extend_from_slice(chunk);
                }
                chunk.len()
            }
        };
        reader.consume(used);
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The index of the first `\n`, eight bytes at a time.
fn newline(bytes: &[u8]) -> Option<usize> {
    const LOW: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    const LF: u64 = u64::from_ne_bytes([b'\n'; 8]);
    let mut words = bytes.chunks_exact(8);
    let mut offset = 0;
    for word in words.by_ref() {
        let x = u64::from_ne_bytes(word.try_into().expect("eight bytes")) ^ LF;
        // A zero byte in x (a '\n' in the word) sets its high bit here (the classic test).
        if x.wrapping_sub(LOW) & !x & HIGH != 0 {
            return word.iter().position(|&b| b == b'\n').map(|i| offset + i);
        }
        offset += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&b| b == b'\n')
        .map(|i| offset + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most `step` bytes per read.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn lines(data: &[u8], max: usize, step: usize) -> Vec<(u64, Result<Vec<u8>, u64>)> {
        let mut out = Vec::new();
        let reader = io::BufReader::with_capacity(step.max(1), Trickle { data, step });
        each_line(reader, max, |n, line| {
            out.push((
                n,
                match line {
                    Line::Text(text) => Ok(text.to_vec()),
                    Line::TooLong(length) => Err(length),
                },
            ));
        })
        .unwrap();
        out
    }

    #[test]
    fn lines_are_the_same_however_the_input_is_split() {
        let data = b"one\r\n\ntwo-is-long\nthree\nfour-over-the-limit-by-far\nfive";
        let expected = vec![
            (1, Ok(b"one".to_vec())),
            (2, Ok(Vec::new())),
            (3, Ok(b"two-is-long".to_vec())),
            (4, Ok(b"three".to_vec())),
            (5, Err(26)),
            (6, Ok(b"five".to_vec())),
        ];
        for step in [1, 2, 3, 7, 8, 64, 4096] {
            assert_eq!(lines(data, 12, step), expected, "step {step}");
        }
        // A line exactly at the limit passes; one byte more does not.
        assert_eq!(
            lines(b"abcd\nabcde\n", 4, 2),
            vec![(1, Ok(b"abcd".to_vec())), (2, Err(5))]
        );
        assert_eq!(lines(b"abcdefgh", 4, 3), vec![(1, Err(8))]);
    }

    #[test]
    fn newlines_are_found_in_every_position() {
        for len in 0..40 {
            for at in 0..len {
                let mut bytes = vec![0xAAu8; len];
                bytes[at] = b'\n';
                assert_eq!(newline(&bytes), Some(at));
                bytes[at] = b'\n' ^ 0x80;
                assert_eq!(newline(&bytes), None);
            }
        }
    }
}
