// Placeholder while the CLI is written (replaced in the same session).
int main() { return 0; }
