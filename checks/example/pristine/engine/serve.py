"""Serves requests through the registered attention target."""
import engine.attention as attention


def handle(query):
    return attention.attend(query)


def generate(prompt, tokens, model_dir):
    """`tokens` output ids for `prompt`: each one the attention of the running state, in the
    vocabulary of the model at `model_dir`."""
    with open(model_dir + "/vocab", "rb") as f:
        modulus = int(f.read())
    state = sum(prompt) % modulus
    out = []
    for k in range(tokens):
        token = attention.attend([(state + k) % modulus], modulus)[0]
        out.append(token)
        state = (state + token) % modulus
    return out
