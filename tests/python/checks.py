"""What the one-process Python tests share: failures collected as sentences, an expected
exception checked for its type and words, and the closing report."""

failures = []


def expect(call, error, *words):
    """call() must raise error, its message holding every word and no TorchScript text (the
    error raised in Python with a sentence, before TorchScript sees the arguments)."""
    try:
        call()
    except error as e:
        message = str(e)
        missing = [w for w in words if w not in message]
        if missing or "TorchScript" in message or "Declaration" in message:
            failures.append(f"{words}: message {message!r} lacks {missing}")
        return
    except Exception as e:  # noqa: BLE001 - the wrong kind is the failure reported
        failures.append(f"{words}: {type(e).__name__} ({e}), not {error.__name__}")
        return
    failures.append(f"{words}: nothing raised")


def report(name):
    """Prints the failures and one line; the exit status."""
    for f in failures:
        print("FAIL", f)
    print(f"{name}:", "FAILED" if failures else "passed")
    return 1 if failures else 0
