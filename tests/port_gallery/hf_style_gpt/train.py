"""Train the small GPT on wikitext-2 with the GPT-2 tokenizer."""
import torch
from datasets import load_dataset
from transformers import AutoTokenizer

from modeling import GPT, GPTConfig

tokenizer = AutoTokenizer.from_pretrained("gpt2")
tokenizer.pad_token = tokenizer.eos_token
raw = load_dataset("wikitext", "wikitext-2-raw-v1", split="train")


def encode(batch):
    return tokenizer(batch["text"], truncation=True, max_length=129, padding="max_length")


tokens = raw.map(encode, batched=True, remove_columns=["text"]).with_format("torch")
loader = torch.utils.data.DataLoader(tokens, batch_size=16, shuffle=True)

config = GPTConfig(block_size=128)
model = GPT(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

for step, batch in enumerate(loader):
    ids = batch["input_ids"]
    logits, loss = model(ids[:, :-1], ids[:, 1:])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        print(f"step {step}: loss {loss.item():.3f}")
