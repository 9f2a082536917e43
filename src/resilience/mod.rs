//! Resilience: what keeps a failing downstream from being hammered and a bad deploy from
//! filling the store. Its pieces:
//!
//! - [`breaker`]: a handler's circuit breaker as a pure state machine; its state lives in
//!   PostgreSQL (`recovery_breaker`, `store/breakers.rs`) so the whole fleet shares it.
//!   The member's view of them, the one follower of the fleet's breakers per member, is
//!   beside the invocation it guards (`handlers/breakers.rs`).
//! - `window`: the sliding window and threshold of the bad-deploy brake; the brake's
//!   fleet row is in `store/brakes.rs`, pausing a route's partitions (any route: an
//!   operator may engage one, `operations/brakes.rs`) in `ingest/brake.rs`.
//!
//! Bulkheads and the shares of fleet rate limits are the worker's admission
//! (`worker/admission.rs`).

pub mod breaker;
pub(crate) mod window;
