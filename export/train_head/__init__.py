"""Training an EAGLE-3-style draft head for a target model on the CPU (`specedge train-drafter`, extra `train`).

    prompts.py  the prompt recipe: topics x instruction templates, our own text (licence: the project's, Apache-2.0)
    data.py     self-distillation data: the target's greedy answers and its taps at every position, in shards
    vocab.py    the draft vocabulary: the Vd most frequent answer tokens (d2t: absolute target ids)
    model.py    the head in torch, exactly docs/train_drafter.md's math (torch imported only here and in train.py)
    train.py    EAGLE-3's training-time test, AdamW + cosine LR, checkpoints, tau on held-out data, head.npz/json

Only model.py and train.py import torch, and only when the command runs (require_torch says how to install it).
"""
