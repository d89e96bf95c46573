#!/usr/bin/env bash
# Diagnostic (temporary): one cross-server tensor move with debug logs and, if it hangs, the
# servers' thread stacks.
cd "$(dirname "$0")/../.."
bin=$(cd dist && pwd)
export RGPU_LOG=debug
CUDA_VISIBLE_DEVICES=0 "$bin/rgpu" server --listen 127.0.0.1:7701 >/tmp/s1.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 "$bin/rgpu" server --listen 127.0.0.1:7702 >/tmp/s2.log 2>&1 &
sleep 4
unset RGPU_LOG
timeout 40 "$bin/rgpu" run --servers 127.0.0.1:7701,127.0.0.1:7702 -- python3 -c '
import torch
a = torch.arange(8.0, device=0)
print("on 0", flush=True)
b = a.to(1)
print("moved", flush=True)
print(b.cpu(), flush=True)
c = torch.ones(1<<24, device=0).to(1)
print("big", c.sum().item(), flush=True)
' 2>&1 | tail -20
echo "rc $?"
which gdb && for p in $(pgrep -f "rgpu server-worker"); do echo "== $p"; timeout 20 gdb -p $p -batch -ex "thread apply all bt 8" 2>/dev/null | grep -E "^Thread|^#" | head -80; done
grep -vE "inventory|serving|platform" /tmp/s1.log | tail -40
echo ======
grep -vE "inventory|serving|platform" /tmp/s2.log | tail -40
