"""The model as the library handles it: a folder loaded and checked against its config, earlier formats upgraded, the
oneDNN kernel for the commands' CPU inference."""
