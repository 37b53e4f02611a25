"""The device-wide counters, read in decodemon's own processes, never in the target.

    sidecar.py         starts the sampler on the target's GPU and reads its frames into the live stream
    sampler.py         the sampler process (`python -I -m decodemon.monitor.counters.sampler`): NVML, and PM
    pm_config.py       PM's metrics (asked for here, read back by the feed), buffer size, who holds busy counters
    libcupti.py        which libcupti the sampler maps (the newest nvidia-cuda-cupti wheel's, before any other)
    copy_bandwidth.py  the device's measured copy (a process of its own, and its cache)
    bandwidth.py       the copy's figure for the monitor: read from the cache, measured before `decodemon run`
"""
