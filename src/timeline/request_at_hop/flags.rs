//! What a request's state at a hop knows about itself, one bit each: a typed set of flags in
//! four bytes.

use std::fmt;

/// One thing a request's state at a hop knows about itself: a bit of [`Flags`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Flag {
    /// The current segment has a record.
    Record,
    /// The run of consecutive seqs holds seqs.
    Covered,
    /// The current segment has a progress record.
    Progress,
    /// The current segment has a visible record.
    Visible,
    /// The last progress record was visible.
    LastVisible,
    /// The current segment has ended.
    Ended,
    /// Some segment had an end record.
    HadEnd,
    /// Details from the lost-from seq on were not all kept.
    Lost,
    /// The sketch of short quiet spells holds something.
    Sketched,
    /// A quiet below the sketch's base went into its first window.
    SketchBelow,
    /// A record was read under a window of its hop's clock.
    Windowed,
    /// Some segment had a hidden record.
    AnyHidden,
    /// Some segment had a visible record.
    AnyVisible,
    /// The last catch-up profile is open.
    CatchingUp,
    /// The current segment ended in a kept stall (the last spell).
    EndSpell,
    /// A spell does not start at or after the one before it ended (a resume went back).
    Unsorted,
    /// A record arrived out of order beyond the reorder window: its stream had taken a later
    /// one, so what its records show is not the stream.
    Disordered,
}

impl Flag {
    /// Every flag, in the order of its bit.
    const ALL: [Flag; 17] = [
        Flag::Record,
        Flag::Covered,
        Flag::Progress,
        Flag::Visible,
        Flag::LastVisible,
        Flag::Ended,
        Flag::HadEnd,
        Flag::Lost,
        Flag::Sketched,
        Flag::SketchBelow,
        Flag::Windowed,
        Flag::AnyHidden,
        Flag::AnyVisible,
        Flag::CatchingUp,
        Flag::EndSpell,
        Flag::Unsorted,
        Flag::Disordered,
    ];

    /// The flags of the current segment: a resumed stream starts a new one without them.
    pub(super) const SEGMENT: [Flag; 6] = [
        Flag::Record,
        Flag::Progress,
        Flag::Visible,
        Flag::LastVisible,
        Flag::Ended,
        Flag::EndSpell,
    ];

    fn bit(self) -> u32 {
        1 << self as u8
    }
}

/// A set of [`Flag`]s, one bit each: room for 32 (in what were padding bytes of a request's
/// state at a hop, which stays 144 bytes).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Flags(u32);

impl Flags {
    /// Whether `flag` is in the set.
    pub(super) fn has(self, flag: Flag) -> bool {
        self.0 & flag.bit() != 0
    }

    /// Puts `flag` in the set.
    pub(super) fn insert(&mut self, flag: Flag) {
        self.0 |= flag.bit();
    }

    /// Takes `flag` out of the set.
    pub(super) fn remove(&mut self, flag: Flag) {
        self.0 &= !flag.bit();
    }

    /// Puts `flag` in the set when `on`, takes it out otherwise.
    pub(super) fn set(&mut self, flag: Flag, on: bool) {
        if on {
            self.insert(flag);
        } else {
            self.remove(flag);
        }
    }

    /// Takes every flag of `flags` out of the set.
    pub(super) fn remove_all(&mut self, flags: &[Flag]) {
        for &flag in flags {
            self.remove(flag);
        }
    }
}

impl fmt::Debug for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(Flag::ALL.iter().filter(|&&flag| self.has(flag)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_flag_is_its_own_bit() {
        assert_eq!(std::mem::size_of::<Flags>(), 4);
        let mut all = 0u32;
        for (at, &flag) in Flag::ALL.iter().enumerate() {
            assert_eq!(flag as usize, at, "{flag:?} out of order");
            all |= flag.bit();
        }
        assert_eq!(all, (1 << Flag::ALL.len()) - 1, "a bit per flag");
        let mut flags = Flags::default();
        flags.insert(Flag::Ended);
        flags.set(Flag::Lost, true);
        flags.insert(Flag::Record);
        assert!(flags.has(Flag::Ended) && flags.has(Flag::Lost) && !flags.has(Flag::HadEnd));
        assert_eq!(format!("{flags:?}"), "{Record, Ended, Lost}");
        flags.remove_all(&Flag::SEGMENT);
        flags.set(Flag::Lost, false);
        assert_eq!(flags, Flags::default());
    }
}
