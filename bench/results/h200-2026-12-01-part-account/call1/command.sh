#!/usr/bin/env bash
OUT=$OUT STEPS="setup account:1 account:2 account:3 job:2:bench:1000:270" bash bench/gpu_account.sh > $OUT/call.log 2>&1
