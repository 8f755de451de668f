//! `talon serve`.
