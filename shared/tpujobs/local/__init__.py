"""The local stack: emulators, the TPU simulator and every function, on loopback.

`processes` starts and stops services, `wiring` creates topics, push subscriptions and the
logs bucket, `stack` ties them together behind `up` / `down` / `env_lines`, and `cli` is
`tpujobs dev`. Nothing is imported here, so `import tpujobs.local` costs nothing.
"""
