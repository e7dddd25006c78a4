"""One module per in-container operation; see operations/__main__.py."""
