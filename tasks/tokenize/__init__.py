"""Tokenize stage: train or load a byte-level BPE tokenizer, encode documents into token shards."""
