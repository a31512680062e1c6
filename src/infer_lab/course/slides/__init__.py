"""The workshop deck, generated from the course: ``deck`` builds it as data, ``render`` writes one HTML file."""
