#!/usr/bin/env bash
MODELS="2 3" OUT=$OUT STEPS="setup account:2 account:3" ACCOUNT_LIMIT=120 bash bench/gpu_account.sh > $OUT/call.log 2>&1
