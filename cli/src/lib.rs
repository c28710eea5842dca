//! The `streamgate` command's parts, as a library so that tests and examples run them in
//! process: [`proxy`] (in front of any OpenAI-compatible server), [`sim`] (the reference
//! server, on the serving code in [`serve`] that a real engine can sit behind too),
//! [`loadgen`] and [`diagnose`].

pub mod client;
pub mod diagnose;
pub mod flags;
pub mod hop_end;
pub mod loadgen;
pub mod page;
pub mod plot;
pub mod proxy;
pub mod request_id;
pub mod resume;
pub mod serve;
pub mod serving;
pub mod sim;
pub mod slowloris;
pub mod trim;
