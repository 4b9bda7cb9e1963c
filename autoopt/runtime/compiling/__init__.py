"""What compiling needs beside the compile pass: a cache that survives restarts, a guard through
the first backward, and the log of what dynamo did."""
