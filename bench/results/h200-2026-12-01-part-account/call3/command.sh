#!/usr/bin/env bash
OUT=$OUT STEPS="job:3:bench:1000:270 job:3:short:1480:270" bash bench/gpu_account.sh > $OUT/call.log 2>&1
