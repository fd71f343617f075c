//! ggml's backend devices as the placement rules see them: name, kind, free
//! memory, and whether a pointer is a device of this ggml at all.

use std::ffi::CStr;

use super::*;

/// What a device is, for placing a drafter on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// The host CPU: always in a drafter's scheduler.
    Cpu,
    /// A GPU, integrated GPU, accelerator or remote (RPC) device.
    Accelerator,
    /// A device made of several others (a model split by tensor, `-sm tensor`).
    Meta,
}

/// A device and what the rules need of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub dev: ggml_backend_dev_t,
    pub name: String,
    pub kind: DeviceKind,
}

impl Device {
    /// # Safety
    /// `dev` must be a live ggml device.
    pub unsafe fn describe(dev: ggml_backend_dev_t) -> Device {
        // SAFETY: a live device (the caller's contract); ggml returns a static name.
        unsafe {
            let name = ggml_backend_dev_name(dev);
            let name = if name.is_null() { "?".into() } else { CStr::from_ptr(name).to_string_lossy().into_owned() };
            let kind = match ggml_backend_dev_type(dev) {
                GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
                GGML_BACKEND_DEVICE_TYPE_META => DeviceKind::Meta,
                _ => DeviceKind::Accelerator,
            };
            Device { dev, name, kind }
        }
    }

    /// Free and total bytes the device reports.
    pub fn memory(&self) -> (u64, u64) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: a live device (made by `describe`).
        unsafe { ggml_backend_dev_memory(self.dev, &mut free, &mut total) };
        (free as u64, total as u64)
    }
}

/// Every device registered with ggml, in its order (CPU, GPUs, RPC servers added so far).
pub fn registered_devices() -> Vec<Device> {
    // SAFETY: indices below ggml's count are live devices.
    unsafe { (0..ggml_backend_dev_count()).map(|i| Device::describe(ggml_backend_dev_get(i))).collect() }
}

/// The devices libllama placed `model` on (empty: the CPU only).
///
/// # Safety
/// `model` must be a live model.
pub unsafe fn model_devices(model: *const llama_model) -> Vec<Device> {
    // SAFETY: a live model (the caller's contract); indices below the count it
    // reports are its live devices.
    unsafe {
        let n = dflash2_shim_model_n_devices(model).max(0);
        (0..n)
            .map(|i| dflash2_shim_model_get_device(model, i))
            .filter(|d| !d.is_null())
            .map(|d| Device::describe(d))
            .collect()
    }
}
