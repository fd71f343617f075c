//! Which devices the drafter goes on, and whether it fits there.
//!
//! The rule: **the drafter goes where the target's output head is.** A drafter
//! without its own head and token embeddings reads the target's in its own
//! graph, so its scheduler must hold the device that holds them: upstream
//! aborts when it does not (a drafter on another GPU than the head: a weight in
//! a buffer no backend of the draft context can run). The target's token
//! embeddings stay in host memory (libllama never offloads its input layer) and
//! the CPU is in every scheduler, so the head decides. A drafter with its own
//! head goes there too by default: the last tap layer's features are produced
//! there, and it is the device the host chose for the end of its model.
//!
//! - default, head on an accelerator (GPU, RPC server): the drafter on it;
//! - default, head in host memory (`-ngl 0`, a CPU-only target): on the CPU;
//! - devices named by the host (`params.devices`, `-devd`): the drafter's layers
//!   and KV go there; if it reads a head on another accelerator, that device is
//!   added to its scheduler with no layers on it (a zero share of the split), so
//!   the head's product runs where the head is instead of aborting;
//! - head split over devices (`-sm tensor`, a meta device): a drafter that reads
//!   it goes on the split's first device (or the named ones) and reads the
//!   head's slices where they are: its graph takes a partial top-k on each
//!   slice's device and merges them (`crate::draft::lattice`; libllama's graph
//!   cannot: upstream's abort). One with its own head needs named devices;
//! - the head's device unknown (a libllama without `llama_model::dev_output`):
//!   every device of the target, as before.
//!
//! Named devices must be ggml devices; CPU ones are dropped (the CPU is always
//! there; an empty list is the CPU only).

use crate::error::{Error, Result};
use crate::sys::{Device, DeviceKind};

/// Names of devices, for messages: "Vulkan0+RPC0", "CPU" for none.
pub fn names(devices: &[Device]) -> String {
    if devices.is_empty() {
        return "CPU".into();
    }
    devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join("+")
}

/// The host's `params.devices`, checked against ggml's registered devices and
/// without CPU devices (empty: the CPU only).
pub fn resolve_named(named: &[crate::sys::ggml_backend_dev_t], registered: &[Device]) -> Result<Vec<Device>> {
    let mut out = Vec::new();
    for (i, &dev) in named.iter().enumerate() {
        let Some(d) = registered.iter().find(|r| r.dev == dev) else {
            return Err(Error::invalid(format!(
                "params.devices[{i}] ({dev:?}) is not a device of this ggml (devices: {})",
                registered.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ")
            )));
        };
        if d.kind != DeviceKind::Cpu && !out.contains(d) {
            out.push(d.clone());
        }
    }
    Ok(out)
}

/// What placing the drafter depends on.
pub struct PlacementInput<'a> {
    /// The host's devices (already resolved), or None for the default.
    pub named: Option<Vec<Device>>,
    /// The drafter lacks its own head or token embeddings and reads the target's.
    pub reads_target_head: bool,
    /// The device of the target's output head, when libllama tells.
    pub head: Option<Device>,
    /// Every device the target model uses (the fallback).
    pub target_devices: &'a [Device],
    /// A head split by tensor: the devices of its slices, in order (empty:
    /// not split, or its slices could not be found).
    pub head_slices: &'a [Device],
}

/// Where the drafter goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Devices that hold the drafter's layers and KV (empty: the CPU).
    pub layers: Vec<Device>,
    /// The device of the target's head the drafter reads, when it is not one
    /// of `layers`: in the drafter's scheduler, with no layers.
    pub head: Option<Device>,
}

impl Placement {
    /// For messages: "Vulkan0", "CPU (with the target's head on Vulkan0)".
    pub fn describe(&self) -> String {
        match &self.head {
            None => names(&self.layers),
            Some(h) => format!("{} (with the target's head on {})", names(&self.layers), h.name),
        }
    }
}

/// The drafter's placement, by the rule above.
pub fn choose(input: PlacementInput) -> Result<Placement> {
    let PlacementInput { named, reads_target_head, head, target_devices, head_slices } = input;
    let only = |layers: Vec<Device>| Placement { layers, head: None };
    if let Some(head) = head.as_ref().filter(|h| h.kind == DeviceKind::Meta) {
        if reads_target_head {
            let Some(first) = head_slices.first() else {
                return Err(Error::unsupported(format!(
                    "the target's output head is split over several devices ({}: split by tensor, -sm tensor), the \
                     drafter reads it, and its per-device slices cannot be found in this ggml. Split the target by \
                     layer (-sm layer), or use a drafter with its own output head and token embeddings",
                    head.name
                )));
            };
            // the graph reads each slice where it is (its devices join the
            // drafter's scheduler); the layers go with the first slice
            return Ok(named.map_or_else(|| only(vec![first.clone()]), only));
        }
        return named.map(only).ok_or_else(|| {
            Error::unsupported(format!(
                "the target is split by tensor ({}): name the drafter's devices (params.devices, -devd)",
                head.name
            ))
        });
    }
    let Some(named) = named else {
        return Ok(only(match head {
            Some(h) if h.kind == DeviceKind::Cpu => Vec::new(),
            Some(h) => vec![h],
            None => target_devices.to_vec(),
        }));
    };
    if !reads_target_head {
        return Ok(only(named));
    }
    match head {
        Some(h) if h.kind != DeviceKind::Cpu && !named.contains(&h) => Ok(Placement { layers: named, head: Some(h) }),
        Some(_) => Ok(only(named)),
        // the head's device unknown: it is one of the target's
        None => match target_devices.iter().find(|d| !named.contains(d)) {
            Some(missing) => Err(Error::incompatible(format!(
                "the drafter has no output head / token embeddings of its own and reads the target's, but \
                 params.devices ({}) leaves out {}, a device of the target, and this libllama does not tell which \
                 device holds the head; name every target device, or use a drafter with its own head",
                names(&named),
                missing.name
            ))),
            None => Ok(only(named)),
        },
    }
}

/// Refuses a drafter of `bytes` (its estimate) on accelerator devices that
/// report less free memory than that in all: a clean error with the numbers,
/// where the allocation would fail inside the backend (or succeed and leave
/// the target's next decode short). Host memory is not checked; a device that
/// reports no memory at all (free = total = 0) is not either.
pub fn check_room(devices: &[Device], memory: impl Fn(&Device) -> (u64, u64), bytes: u64) -> Result<()> {
    let reports: Vec<(u64, u64)> = devices.iter().map(&memory).collect();
    if devices.is_empty() || reports.iter().all(|&(free, total)| free == 0 && total == 0) {
        return Ok(());
    }
    let free: u64 = reports.iter().map(|r| r.0).sum();
    if free >= bytes {
        return Ok(());
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let per_device = devices
        .iter()
        .zip(&reports)
        .map(|(d, (free, total))| format!("{} {:.1} MiB free of {:.1} MiB", d.name, mib(*free), mib(*total)))
        .collect::<Vec<_>>()
        .join(", ");
    Err(Error::out_of_memory(format!(
        "the drafter needs {:.1} MiB (weights, draft KV and compute buffers, llama_spec_dflash2_estimate_memory) on \
         {}, which has {per_device}; free memory there (a smaller target context or fewer offloaded target layers), \
         or put the drafter elsewhere (params.devices)",
        mib(bytes),
        names(devices)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    fn dev(id: usize, name: &str, kind: DeviceKind) -> Device {
        Device { dev: id as crate::sys::ggml_backend_dev_t, name: name.into(), kind }
    }

    fn cpu() -> Device {
        dev(1, "CPU", DeviceKind::Cpu)
    }
    fn vk() -> Device {
        dev(2, "Vulkan0", DeviceKind::Accelerator)
    }
    fn rpc() -> Device {
        dev(3, "RPC0", DeviceKind::Accelerator)
    }
    fn meta() -> Device {
        dev(4, "Meta(Vulkan0,RPC0)", DeviceKind::Meta)
    }

    fn place(named: Option<Vec<Device>>, reads: bool, head: Option<Device>, target: &[Device]) -> Result<Placement> {
        choose(PlacementInput { named, reads_target_head: reads, head, target_devices: target, head_slices: &[] })
    }

    fn on(layers: Vec<Device>) -> Placement {
        Placement { layers, head: None }
    }

    #[test]
    fn by_default_the_drafter_goes_with_the_head() {
        let target = [vk(), rpc()];
        assert_eq!(place(None, true, Some(rpc()), &target).unwrap(), on(vec![rpc()]));
        assert_eq!(place(None, false, Some(vk()), &target).unwrap(), on(vec![vk()]));
        // head kept in host memory (-ngl 0): the CPU
        assert_eq!(place(None, true, Some(cpu()), &target).unwrap(), on(vec![]));
        // a libllama that does not tell: every target device
        assert_eq!(place(None, true, None, &target).unwrap(), on(target.to_vec()));
    }

    #[test]
    fn named_devices_get_the_head_they_read_without_layers() {
        let target = [vk()];
        // the CPU named, the head on Vulkan0: layers on the CPU, Vulkan0 for the head
        let p = place(Some(vec![]), true, Some(vk()), &target).unwrap();
        assert_eq!(p, Placement { layers: vec![], head: Some(vk()) });
        assert_eq!(p.describe(), "CPU (with the target's head on Vulkan0)");
        assert_eq!(place(Some(vec![rpc()]), true, Some(vk()), &target).unwrap().head, Some(vk()));
        // its own head: only what was named
        assert_eq!(place(Some(vec![]), false, Some(vk()), &target).unwrap(), on(vec![]));
        // a head in host memory: any device can read it
        assert_eq!(place(Some(vec![vk()]), true, Some(cpu()), &[]).unwrap(), on(vec![vk()]));
        assert_eq!(place(Some(vec![rpc(), vk()]), true, Some(vk()), &target).unwrap(), on(vec![rpc(), vk()]));
        // unknown head: every target device must be named, as before
        let err = place(Some(vec![vk()]), true, None, &[vk(), rpc()]).unwrap_err();
        assert_eq!(err.status, Status::LLAMA_SPEC_DFLASH2_ERR_INCOMPATIBLE);
        assert!(err.message.contains("RPC0"), "{}", err.message);
    }

    #[test]
    fn a_tensor_split_head_takes_the_drafter_to_its_first_slice() {
        let slices = [vk(), rpc()];
        let split = |named: Option<Vec<Device>>, reads: bool, slices: &[Device]| {
            choose(PlacementInput {
                named,
                reads_target_head: reads,
                head: Some(meta()),
                target_devices: &[meta()],
                head_slices: slices,
            })
        };
        assert_eq!(split(None, true, &slices).unwrap(), on(vec![vk()]));
        assert_eq!(split(Some(vec![rpc()]), true, &slices).unwrap(), on(vec![rpc()]));
        // slices not found (a stripped ggml): refused, with the way out
        let err = split(None, true, &[]).unwrap_err();
        assert_eq!(err.status, Status::LLAMA_SPEC_DFLASH2_ERR_UNSUPPORTED);
        assert!(err.message.contains("-sm layer"), "{}", err.message);
        // its own head: named devices, as before
        assert_eq!(split(Some(vec![vk()]), false, &slices).unwrap(), on(vec![vk()]));
        assert!(split(None, false, &slices).is_err());
    }

    #[test]
    fn named_devices_are_checked_against_ggml() {
        let registered = [cpu(), vk(), rpc()];
        let got = resolve_named(&[3 as _, 1 as _, 3 as _], &registered).unwrap();
        assert_eq!(got, vec![rpc()], "CPU dropped, duplicates once");
        let err = resolve_named(&[2 as _, 99 as _], &registered).unwrap_err();
        assert_eq!(err.status, Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
        assert!(err.message.contains("params.devices[1]") && err.message.contains("Vulkan0"), "{}", err.message);
    }

    #[test]
    fn room_is_checked_on_accelerators_only() {
        const MIB: u64 = 1 << 20;
        let full = |_: &Device| (10 * MIB, 1000 * MIB);
        let err = check_room(&[vk()], full, 31 * MIB).unwrap_err();
        assert_eq!(err.status, Status::LLAMA_SPEC_DFLASH2_ERR_OUT_OF_MEMORY);
        assert!(err.message.contains("31.0 MiB") && err.message.contains("Vulkan0 10.0 MiB free of 1000.0 MiB"));
        assert!(check_room(&[vk()], full, 10 * MIB).is_ok());
        assert!(check_room(&[], full, u64::MAX).is_ok(), "the CPU is not checked");
        assert!(check_room(&[rpc()], |_| (0, 0), u64::MAX).is_ok(), "a device that reports nothing");
        // two devices: their free memory together
        assert!(check_room(&[vk(), rpc()], full, 20 * MIB).is_ok());
        assert!(check_room(&[vk(), rpc()], full, 21 * MIB).is_err());
    }
}
