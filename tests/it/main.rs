//! The gateway's wire tests, in one binary (one link of the whole gateway instead of one per
//! file): real processes and Pingora services on loopback ports, real HTTP on the wire, real
//! `redis-server`s the tests start themselves. One module per concern; [`harness`] holds what
//! they share. The core's own tests (properties, config, golden files) live in
//! `crates/core/tests/` and build without Pingora.

mod harness;

mod cli;
mod cluster;
mod demo;
mod deploy;
mod doc_examples;
mod docnames;
mod edge;
mod edge_h2;
mod faults;
mod fleet_demo;
mod forgets_nothing;
mod gateway;
mod issued;
mod keys;
mod openapi;
mod operate;
mod overrides;
mod quotas;
mod shadow;
mod standin;
mod tls;
mod traces;
mod usage;
mod webhook;
