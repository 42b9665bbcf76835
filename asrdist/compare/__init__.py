"""`asrdist compare`: one recipe trained under several strategies, side by side in one report."""
