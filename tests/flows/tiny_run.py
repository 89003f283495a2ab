"""The flow tests' own tiny training, whatever configs/demo.toml trains.

The demo trains a model that learns in about three minutes on 2 cores (configs/demo.toml, chosen by
bench/demo_sweep.py); tests that run the whole pipeline check its mechanics, not learning, so they
put back the old demo's 0.62M-parameter model, batch and mixture over the demo config.
"""

TINY_RUN = ["train.model.dim=64", "train.model.n_layers=2", "train.model.n_heads=4", "train.model.n_kv_heads=2",
            "train.model.ffn_hidden=192", "train.data.seq_len=128", "train.data.global_batch=16",
            "train.optim.lr=3e-3", "train.optim.warmup_steps=5", "mixture.web=0.8", "mixture.code=0.2"]
