"""What to install: the torch table (matrix), the gates a build must pass, what the wheel indexes hold (indexfacts
parsed, indexread fetched and cached), the two merged (knowledge), mirror rules, and the chosen wheels; a site
mirror's files and pages from locks (sitemirror) and their download (mirrorfill). Everything here is pure except
indexread, indexfetch and mirrorfill."""
