"""Read-only: what NVML says of each MIG GPU-instance profile on this machine's GPUs (slices, memory, copy
engines), without enabling MIG or creating anything. The profile table in ``gpus/mig.py`` is checked against
these answers (``tests/agent/data/*_mig_profiles_*.json``, recorded on lent machines).

    python3 bench/mig_profiles.py > mig_profiles.json     # on a GPU machine with pynvml (nvidia-ml-py)

A profile the GPU does not offer answers NVML's "not supported"; it is left out. Exit 1 when NVML cannot start.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception as error:  # noqa: BLE001 - no driver, no library: say so
        print(json.dumps({"error": f"NVML did not start: {error}"}))
        return 1
    names = sorted(n for n in dir(nv) if n.startswith("NVML_GPU_INSTANCE_PROFILE_") and not n.endswith("_COUNT"))
    out = {"driver": nv.nvmlSystemGetDriverVersion(), "gpus": []}
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        name = nv.nvmlDeviceGetName(handle)
        gpu = {"index": index, "name": name if isinstance(name, str) else name.decode(), "profiles": []}
        try:
            current, pending = nv.nvmlDeviceGetMigMode(handle)
            gpu["mig_mode"] = {"current": current, "pending": pending}
        except nv.NVMLError as error:
            gpu["mig_mode"] = str(error)
        for constant in names:
            profile = getattr(nv, constant)
            if not isinstance(profile, int):
                continue
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
            except nv.NVMLError as error:
                gpu["profiles"].append({"constant": constant, "error": str(error)})
                continue
            row = {"constant": constant, "id": getattr(info, "id", None)}
            for field in ("sliceCount", "instanceCount", "multiprocessorCount", "copyEngineCount", "decoderCount",
                          "encoderCount", "jpegCount", "ofaCount", "memorySizeMB"):
                row[field] = getattr(info, field, None)
            gpu["profiles"].append(row)
        out["gpus"].append(gpu)
    nv.nvmlShutdown()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
