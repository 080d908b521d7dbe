//! See the crate docs. (Filled in by the issue that owns this contract.)
