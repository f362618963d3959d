from paramserver.cli.main import command

command()
