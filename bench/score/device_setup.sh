#!/usr/bin/env bash
# Source this on the device machine: installs the carried wheels (.whl/) to /tmp/site and puts
# them and src/ on PYTHONPATH. The device image has torch, transformers, triton, accelerate.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=/tmp/site:$PWD/src
export PYTHONUNBUFFERED=1
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
