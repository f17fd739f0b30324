"""The engine's state: the store interface backends implement (top-level ``state``), the
byte format and the keys of its entries, and a window's state read and write."""
