//! One engine per target context. An engine turns on the capture of its tap
//! layers in the target and turns it off when freed; a second engine on the
//! same context would lose its captured rows when the first is freed (libllama
//! then aborts on reading them), so it is refused while the first lives.

use parking_lot::Mutex;

use crate::error::{Error, Result};

/// Target contexts (by address) that have a live engine.
static CLAIMED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// A live engine's hold on its target context, released when dropped.
pub struct TargetClaim {
    addr: usize,
}

impl TargetClaim {
    pub fn take(addr: usize) -> Result<TargetClaim> {
        let mut claimed = CLAIMED.lock();
        if claimed.contains(&addr) {
            return Err(Error::invalid_state(
                "this target context already has a dflash2 engine; free it first \
                 (one engine serves every sequence of a context: set params.n_seq)",
            ));
        }
        claimed.push(addr);
        Ok(TargetClaim { addr })
    }
}

impl Drop for TargetClaim {
    fn drop(&mut self) {
        CLAIMED.lock().retain(|&a| a != self.addr);
    }
}
