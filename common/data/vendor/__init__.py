"""Writers of the data formats the vendor's reference folders read, from this zoo's own data."""
