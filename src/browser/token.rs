//! Probe tokens: what a page shows to write records for the stream it was given, and nobody
//! else's.

use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use super::refusal::Refusal;

/// How long a token is good for after the stream's response gave it: long enough for a long
/// stream and the page's last batch after it.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(60 * 60);

/// Tokens of this process: a keyed hash (SipHash, with this process's random keys) of the
/// request id and the second the token was given, so a token names one request and its age,
/// and none can be made without the keys.
#[derive(Debug)]
pub(super) struct Tokens {
    keys: RandomState,
    epoch: Instant,
}

impl Tokens {
    pub(super) fn new() -> Self {
        Tokens {
            keys: RandomState::new(),
            epoch: Instant::now(),
        }
    }

    /// The token for `request`, given now: `{second:x}.{32 hex digits}`.
    pub(super) fn give(&self, request: &str) -> String {
        let second = self.epoch.elapsed().as_secs();
        let (high, low) = self.mac(request, second);
        format!("{second:x}.{high:016x}{low:016x}")
    }

    /// Whether `token` was given for `request` by these tokens, no longer than
    /// [`TOKEN_LIFETIME`] ago.
    pub(super) fn check(&self, request: &str, token: &str) -> Result<(), Refusal> {
        self.check_at(request, token, self.epoch.elapsed().as_secs())
    }

    /// [`check`](Tokens::check), `now` seconds after these tokens began.
    fn check_at(&self, request: &str, token: &str, now: u64) -> Result<(), Refusal> {
        let (second, mac) = token.split_once('.').ok_or(Refusal::BadToken)?;
        let second = u64::from_str_radix(second, 16).map_err(|_| Refusal::BadToken)?;
        let (high, low) = self.mac(request, second);
        let expected = format!("{high:016x}{low:016x}");
        // Every byte compared, whatever the first difference.
        let differs = mac.len() != expected.len()
            || mac
                .bytes()
                .zip(expected.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                != 0;
        if differs {
            return Err(Refusal::BadToken);
        }
        if now.saturating_sub(second) > TOKEN_LIFETIME.as_secs() || second > now {
            return Err(Refusal::Expired);
        }
        Ok(())
    }

    fn mac(&self, request: &str, second: u64) -> (u64, u64) {
        (
            self.keys.hash_one((request, second, 0u8)),
            self.keys.hash_one((request, second, 1u8)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_request_only() {
        let tokens = Tokens::new();
        let token = tokens.give("req-1");
        assert_eq!(tokens.check("req-1", &token), Ok(()));
        assert_eq!(tokens.check("req-2", &token), Err(Refusal::BadToken));
        // Another process's keys.
        assert_eq!(Tokens::new().check("req-1", &token), Err(Refusal::BadToken));
        for forged in [
            "",
            "0",
            "0.",
            "zz.00",
            &token[..token.len() - 1],
            &format!("{token}0"),
        ] {
            assert_eq!(
                tokens.check("req-1", forged),
                Err(Refusal::BadToken),
                "{forged}"
            );
        }
    }

    #[test]
    fn an_old_token_has_expired() {
        let tokens = Tokens::new();
        let token = tokens.give("req-1");
        let lifetime = TOKEN_LIFETIME.as_secs();
        assert_eq!(tokens.check_at("req-1", &token, lifetime), Ok(()));
        assert_eq!(
            tokens.check_at("req-1", &token, lifetime + 5),
            Err(Refusal::Expired)
        );
        // Given "later" than now: not one of ours either way.
        let (high, low) = tokens.mac("req-1", 1_000);
        let future = format!("3e8.{high:016x}{low:016x}");
        assert_eq!(tokens.check_at("req-1", &future, 10), Err(Refusal::Expired));
    }
}
