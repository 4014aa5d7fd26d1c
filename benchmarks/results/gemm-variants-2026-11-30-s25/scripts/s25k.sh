#!/usr/bin/env bash
# session 25 call 19: are equal TMA loads from SMs of one GPC merged before L2? (.exp/merge_probe.py under ncu)
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
python3 .exp/merge_probe.py 2>&1 | tail -8
timeout 120 ncu --metrics lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum -k merge_probe \
  python3 .exp/merge_probe.py 2>&1 | grep -E "merge_probe|lts__|gpu__|launched|FAILED" | head -40
