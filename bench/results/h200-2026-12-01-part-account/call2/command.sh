#!/usr/bin/env bash
OUT=$OUT STEPS="job:2:bench:1000:270:tts.cosyvoice.batch_size=128 job:2:short:1480:270" bash bench/gpu_account.sh > $OUT/call.log 2>&1
