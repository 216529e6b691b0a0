"""What the tests share: the one home of fixtures' helpers, toy models, recording helpers and golden files."""
